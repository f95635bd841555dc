"""The optimizer's step priced from the profile's plain-SGD reading, by what each optimizer
reads and writes (values.training.OPTIMIZER_PASSES)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.predict import predict
from pipecast.values.hardware.presets import describe
from pipecast.values.strategy import Strategy


@pytest.mark.parametrize(("optimizer", "ms"), [("sgd", 3.0), ("momentum", 5.0), ("adam", 7.0)])
def test_a_step_costs_what_its_optimizer_reads_and_writes(optimizer: str, ms: float) -> None:
    """Two blocks whose plain SGD step the profile read as 1.5 ms each: SGD passes over the
    weight and its gradient and writes the weight (3 tensors), momentum 5, Adam 7, so one
    device steps in 3, 5 and 7 ms."""
    profile = make_profile([1e-3] * 2, params=[4000] * 2)
    profile = replace(
        profile, blocks=tuple(replace(b, optimizer_step=1.5e-3) for b in profile.blocks)
    )
    one = Strategy(kind="single")
    t = predict(
        profile, describe(gpus_per_node=1, memory="80GiB"), one, 8, optimizer=optimizer
    ).timeline  # type: ignore[arg-type]
    [step] = [e for e in t.events if e.kind == "optimizer"]
    assert step.duration == pytest.approx(ms * 1e-3)
