"""Dynamic loss scaling over a pipeline: the steps it skips, the scales it runs with and the
weights it ends with are those of one process accumulating the same micro-batches under
torch.amp.GradScaler (whether a backward overflows depends on how many samples it sums),
eager and replayed as CUDA graphs (the CPU stand-in, pipecast.runtime.graphs)."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tests.runtime.helpers import assert_close, assert_replayed, merged, pipeline_job, run, run_all

from pipecast.errors import ConfigError
from pipecast.runtime import checkpoint, graphs
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.config import RunConfig
from pipecast.runtime.run import JobResult
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload

LENET = Workload(model="lenet5", dataset="mnist")
# 2**20 overflows the fp16 backward of LeNet's first step; a clean step every 2 doubles it
CONFIG = RunConfig(
    dtype="fp16", autocast=True, lr=0.1, timeout_s=60, loss_scale=2.0**20, loss_scale_interval=2
)


def _reference(steps: int, batch: int) -> tuple[dict[str, torch.Tensor], list[float], list[bool]]:
    torch.manual_seed(0)
    model = LENET.build()
    opt = torch.optim.SGD(model.parameters(), lr=CONFIG.lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=2)
    scales, skipped = [], []
    for step in range(steps):  # the pipeline's 4 micro-batches, accumulated
        opt.zero_grad(set_to_none=True)
        x, y = synthetic_batch(LENET.spec, batch, seed=step)
        scales.append(scaler.get_scale())
        for xm, ym in zip(x.chunk(4), y.chunk(4), strict=True):
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(xm)
            loss = loss_for(LENET.spec)(out, ym) * (len(xm) / batch)
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < scales[-1])
    return {n: p.detach().clone() for n, p in model.named_parameters()}, scales, skipped


STEPS, BATCH = 5, 12


@functools.cache
def _runs() -> tuple[JobResult, JobResult]:
    """The same job eager and graphed (its first step eager, the rest replayed)."""
    job = pipeline_job(LENET, "1f1b", 2, 4, [0, 6, 12], batch=BATCH, steps=STEPS, config=CONFIG)
    graphed = replace(job, config=replace(CONFIG, cuda_graphs=True))
    eager_run, graphed_run = run_all([job, graphed], env={graphs.STAND_IN_ENV: "1"})
    return eager_run, graphed_run


def _assert_scaled_as_torch(result: JobResult) -> None:
    want, scales, skipped = _reference(STEPS, BATCH)
    assert skipped[0] and not all(skipped)  # the case exercises both branches
    last = next(r for r in result.reports if r.pipeline_rank == 1)
    assert [s.loss_scale for s in last.steps] == scales
    assert [s.skipped for s in last.steps] == skipped
    assert_close(merged(result, "params"), want, rtol=1e-3)


@pytest.mark.slow
def test_loss_scaling_skips_and_scales_as_torch_does(tmp_path: Path) -> None:
    result = _runs()[0]
    _assert_scaled_as_torch(result)
    job = result.job
    want, scales, _ = _reference(STEPS, BATCH)
    # a checkpoint carries the scale: resumed after step 2, the same scales follow
    cp = Checkpointing(str(tmp_path), resume=True)
    run(replace(job, steps=2, checkpoint=cp))
    saved = checkpoint.latest(tmp_path)
    assert saved is not None and saved.meta["loss_scale"] == scales[2]
    resumed = run(replace(job, checkpoint=cp))
    last = next(r for r in resumed.reports if r.pipeline_rank == 1)
    assert [s.loss_scale for s in last.steps] == scales[3:]  # step 2 warms up untimed
    assert_close(merged(resumed, "params"), want, rtol=1e-3)


@pytest.mark.slow
def test_graphed_steps_scale_the_loss_as_eager_ones() -> None:
    """Inside the graphs the loss is multiplied by the step's scale as eager steps do: a
    graph that dropped it would not overflow where torch does, and end elsewhere."""
    eager, graphed = _runs()
    _assert_scaled_as_torch(graphed)
    assert_close(merged(graphed, "params"), merged(eager, "params"), rtol=1e-6)
    assert_replayed(graphed)


def test_scaling_defaults_to_fp16_and_refuses_pipedream() -> None:
    assert RunConfig(dtype="fp16").initial_loss_scale == 2.0**16
    assert RunConfig(dtype="bf16").initial_loss_scale == 0.0
    assert RunConfig(dtype="fp16", loss_scale=0.0).initial_loss_scale == 0.0
    with pytest.raises(ConfigError, match="loss_scale must be 0 or more"):
        RunConfig(loss_scale=-1.0)
    for bad in ({"lr": -0.1}, {"lr": float("nan")}, {"timeout_s": 0.0}, {"bucket_bytes": 0}):
        with pytest.raises(
            ConfigError, match=r"learning rate must be|timeout must be above|bucket_bytes must be"
        ):
            RunConfig(**bad)  # type: ignore[arg-type]
    job = pipeline_job(LENET, "pipedream", 2, 4, [0, 6, 12])
    with pytest.raises(ConfigError, match="PipeDream updates each stage on its own"):
        replace(job, config=RunConfig(dtype="fp16", loss_scale=1024.0)).check()
    replace(job, config=RunConfig(dtype="fp16")).check()  # automatic scaling stays off there
