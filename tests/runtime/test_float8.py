"""Float8 training (pipecast.runtime.float8): refused in one line where it can't run,
and only the Linears FP8 products take are swapped."""

from __future__ import annotations

import importlib.util

import pytest
from torch import nn

from pipecast.errors import ConfigError
from pipecast.planning.partition import from_boundaries
from pipecast.planning.schedules import make_plan
from pipecast.runtime import float8
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.values.models import Workload


def _job(device: str) -> TrainJob:
    workload = Workload(model="gpt", dataset="tokens", layers=1, width=32, seq_len=16)
    return TrainJob(
        plan=make_plan("1f1b", 1, 1),
        partition=from_boundaries([0, 3]),
        batch=2,
        workload=workload,
        dataset="tokens",
        config=RunConfig(float8=True),
        device=device,  # type: ignore[arg-type]
    )


def test_a_job_without_fp8_units_is_refused_before_it_starts() -> None:
    with pytest.raises(ConfigError, match="Float8 training needs") as err:
        _job("cpu").check()
    assert "\n" not in str(err.value)


def test_without_torchao_the_refusal_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    assert float8.why_not("cuda") == f"Float8 training needs torchao: {float8.INSTALL}"


def test_only_linears_whose_sides_are_multiples_of_16_are_swapped() -> None:
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10), nn.Linear(10, 16))
    assert float8.convert(model) == 1
    kinds = [type(m) for m in model]
    assert kinds == [Float8Linear, nn.ReLU, nn.Linear, nn.Linear]
