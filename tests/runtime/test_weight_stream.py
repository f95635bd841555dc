"""Streamed weights beside recomputation (pipecast.runtime.weight_stream): which block's
weights are on the device when, in a stage's forward and in the forward its backward
recomputes; and pipelines that stream and recompute end at one process's weights."""

from __future__ import annotations

import functools

import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, reference_step, run_all
from torch import nn

from pipecast.runtime.config import RunConfig
from pipecast.runtime.run import JobResult
from pipecast.runtime.stage import StageModule
from pipecast.runtime.weight_stream import WeightStream, groups
from pipecast.values.models import Workload

LENET = Workload(model="lenet5", dataset="mnist")  # 12 blocks, weightless ones among them


def _logged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every copy in ("in", block) and release ("out", block) of a block with weights, in
    order."""
    log: list[tuple[str, int]] = []
    bring, release = WeightStream._bring, WeightStream._release

    def logged_bring(self: WeightStream, block: object) -> None:
        if not block.resident and block.params:  # type: ignore[attr-defined]
            log.append(("in", block.index))  # type: ignore[attr-defined]
        bring(self, block)  # type: ignore[arg-type]

    def logged_release(self: WeightStream, block: object) -> None:
        if block.resident and block.params:  # type: ignore[attr-defined]
            log.append(("out", block.index))  # type: ignore[attr-defined]
        release(self, block)  # type: ignore[arg-type]

    monkeypatch.setattr(WeightStream, "_bring", logged_bring)
    monkeypatch.setattr(WeightStream, "_release", logged_release)
    return log


def _stage(model: nn.Sequential) -> StageModule:
    config = RunConfig(offload="weights", recompute="all")
    return StageModule(0, model, torch.device("cpu"), config, first=True, last=True)


def _linears(pattern: str) -> nn.Sequential:
    """A block per letter: L a Linear(6, 6) with a Tanh, T a Tanh alone (no weights)."""
    torch.manual_seed(0)
    made = {"L": lambda: nn.Sequential(nn.Linear(6, 6), nn.Tanh()), "T": nn.Tanh}
    return nn.Sequential(*(made[c]() for c in pattern))


def test_a_recomputed_backward_brings_each_block_in_as_it_recomputes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four blocks with weights. The forward makes each block resident and prefetches the
    next, releasing the one before; the backward recomputes block 3 (still in place) with
    block 2 prefetched, then each block below as autograd reaches it, prefetching the one
    below it and releasing the one above, whose backward is done. One copy of blocks 0-2
    in each direction: the recomputation and its backward share it."""
    log = _logged(monkeypatch)
    st = _stage(_linears("LLLL"))
    assert st.streamed is not None
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    log.clear()
    out = st.forward(x, recompute=True)
    assert log == [("in", 0), ("in", 1), ("out", 0), ("in", 2), ("out", 1), ("in", 3), ("out", 2)]
    log.clear()
    out.square().sum().backward()
    assert log == [("in", 2), ("out", 3), ("in", 1), ("out", 2), ("in", 0), ("out", 1)]
    plain = _linears("LLLL")
    plain(x).square().sum().backward()
    for a, b in zip(plain.parameters(), st.params, strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.equal(a.grad, b.grad)


def test_weightless_blocks_ride_with_the_block_before_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks T L T L: checkpoints [T L T] and [L]. Recomputing [L] (block 3) prefetches
    block 1, the nearest below with weights; recomputing [T L T] releases block 3 and keeps
    block 1 through its weightless blocks, for the group's backward."""
    assert [len(g) for g in groups(list(_linears("TLTL")))] == [3, 1]
    assert [len(g) for g in groups(list(_linears("LTTLL")))] == [3, 1, 1]
    log = _logged(monkeypatch)
    st = _stage(_linears("TLTL"))
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    log.clear()
    out = st.forward(x, recompute=True)
    assert log == [("in", 1), ("out", 1), ("in", 3)]
    log.clear()
    out.square().sum().backward()
    assert log == [("in", 1), ("out", 3)]
    plain = _linears("TLTL")
    plain(x).square().sum().backward()
    for a, b in zip(plain.parameters(), st.params, strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.equal(a.grad, b.grad)


PIPELINES = [
    (schedule, ranks, offload, recompute)
    for ranks in (1, 2)
    for schedule in ("gpipe", "1f1b", "zb-h1")
    for offload, recompute in (("weights", "all"),)
] + [
    ("1f1b", 2, "all", "all"),
    ("1f1b", 1, "all", "all"),
    ("1f1b", 1, "both", "all"),
    ("gpipe", 2, "weights", "all-but-last"),
]
"""Streamed weights, recomputed, over one rank and two; with the activations on the host
too (a recomputed micro-batch's checkpoints' inputs move), streamed or not; and beside
GPipe's last micro-batch, which is not recomputed and saves its weights through the
stream's hooks."""


@functools.cache
def _results() -> dict[tuple[str, int, str, str], JobResult]:
    jobs = {}
    for schedule, ranks, offload, recompute in PIPELINES:
        config = RunConfig(lr=0.1, timeout_s=60, offload=offload, recompute=recompute)  # type: ignore[arg-type]
        bounds = [0, 12] if ranks == 1 else [0, 6, 12]
        jobs[(schedule, ranks, offload, recompute)] = pipeline_job(
            LENET, schedule, ranks, 4, bounds, batch=12, config=config, steps=2
        )
    return dict(zip(jobs, run_all(list(jobs.values())), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "ranks", "offload", "recompute"), PIPELINES)
def test_streamed_and_recomputed_pipelines_match_one_process(
    schedule: str, ranks: int, offload: str, recompute: str
) -> None:
    """Two steps (the second brings in the weights the host's optimizer stepped): the
    gradients of the second and the weights after it are one process's."""
    result = _results()[(schedule, ranks, offload, recompute)]
    torch.manual_seed(0)
    want_params, want_grads = reference_step(LENET.build(), LENET, 12, steps=2)
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)


def test_a_stage_compiled_whole_is_not_streamed_and_recomputed() -> None:
    """One graph for the stage can't recompute a block at a time: refused before anything
    runs, naming the fix; recomputation alone, or blocks compiled one by one, are not."""
    from pipecast.errors import ConfigError

    with pytest.raises(ConfigError, match="compile 'blocks' or 'off'"):
        RunConfig(offload="weights", recompute="all", compile="stage")
    RunConfig(offload="weights", recompute="all", compile="blocks")
    RunConfig(offload="weights", compile="stage")
