"""Gradient clipping over the whole pipeline and learning-rate schedules: the weights of one
process that clips with torch.nn.utils.clip_grad_norm_ and sets the same rates."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, run_all

from pipecast.errors import ConfigError
from pipecast.runtime.config import RunConfig
from pipecast.runtime.run import JobResult
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload
from pipecast.values.training import learning_rate

LENET = Workload(model="lenet5", dataset="mnist")


def test_warmup_then_decay() -> None:
    rates = [learning_rate(1.0, s, 10, schedule="cosine", warmup=4, floor=0.1) for s in range(10)]
    assert rates[:4] == [0.25, 0.5, 0.75, 1.0]
    assert rates[-1] == pytest.approx(0.1)
    assert rates[4:] == sorted(rates[4:], reverse=True)
    # half way through the decay, a half cosine stands half way between base and floor
    assert learning_rate(1.0, 6, 11, schedule="cosine", warmup=2, floor=0.0) == pytest.approx(0.5)
    assert learning_rate(1.0, 6, 11, schedule="linear", warmup=2, floor=0.0) == pytest.approx(0.5)
    assert learning_rate(2.0, 5, 10, schedule="linear") == pytest.approx(2.0 * (1 - 5 / 9))
    assert learning_rate(1.0, 9, 10) == 1.0  # constant
    assert learning_rate(1.0, 0, 1, schedule="cosine") == 1.0  # one step: nothing to decay


def test_bad_settings_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="unknown learning-rate schedule 'step'"):
        RunConfig(lr_schedule="step")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be 0 or more"):
        RunConfig(clip_grad_norm=-1.0)
    job = pipeline_job(LENET, "pipedream", 2, 4, [0, 6, 12])
    with pytest.raises(ConfigError, match="PipeDream updates each stage on its own"):
        replace(job, config=RunConfig(clip_grad_norm=1.0)).check()


def _reference(config: RunConfig, batch: int, steps: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = LENET.build()
    loss_fn = loss_for(LENET.spec)
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x, y = synthetic_batch(LENET.spec, batch, seed=step)
        loss_fn(model(x), y).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        assert float(norm) > config.clip_grad_norm  # the clipping is doing something
        lr = learning_rate(
            config.lr, step, steps, schedule=config.lr_schedule, warmup=config.lr_warmup
        )
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad  # type: ignore[operator]
    return {n: p.detach().clone() for n, p in model.named_parameters()}


CLIPPED = [("1f1b", 1), ("zb-h1", 1), ("1f1b", 2)]
CONFIG = RunConfig(lr=0.2, timeout_s=60, clip_grad_norm=0.05, lr_schedule="cosine", lr_warmup=1)


@functools.cache
def _results() -> list[JobResult]:
    jobs = [
        pipeline_job(
            LENET, schedule, 2, 4, [0, 6, 12], batch=12 * replicas, steps=3, config=CONFIG,
            replicas=replicas,
        )
        for schedule, replicas in CLIPPED
    ]  # fmt: skip
    return run_all(jobs)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CLIPPED)))
def test_clipped_and_scheduled_steps_match_one_process(case: int) -> None:
    result = _results()[case]
    assert_close(merged(result, "params"), _reference(CONFIG, result.job.batch, 3))
    norms = [s.grad_norm for r in result.reports for s in r.steps]
    assert all(n is not None and n > 0.05 and math.isfinite(n) for n in norms)
    # every rank read the same global norm
    for step in range(3):
        seen = {s.grad_norm for r in result.reports for s in r.steps if s.step == step}
        assert len(seen) == 1, seen
