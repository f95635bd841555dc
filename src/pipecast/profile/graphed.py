"""A model's device times as CUDA graph replays: what it costs a graphed stage's device.

A graphed stage (`RunConfig.cuda_graphs`, pipecast.runtime.graphs) issues its forward and
its whole backward with one launch each, so its device runs them at its own pace however
slowly the host issues ops. The eager profile's device times can't show that pace where
the host binds: a block's kernels there run as fast as they are issued, and passes behind a
hold (ProfileOptions.hide_issue) are given up where the host waits on its device (GPT,
ResNet-50 and ResNet-152 on 4 x H100).

Here a module (one block, or the whole model) is captured through the runtime's own
StageGraphs (one slot), so the graphs are the ones a stage of it replays: the input copied
into the slot, the backward adding parameter gradients to `.grad` and returning the
input's gradient. The passes are issued behind a hold that outlasts their issuing, so the
device runs them back to back and its events time the device alone. Each block pays a
graph launch and an input copy that a stage of several blocks pays once; the profiler
shares the whole model's graphed time out in the blocks' proportions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pipecast import devices
from pipecast.profile.hold import HIDE_LEAD
from pipecast.profile.measure import needs_input_copy
from pipecast.profile.options import ProfileOptions
from pipecast.profile.stats import robust
from pipecast.runtime.graphs import stage_graphs

ATTEMPTS = 4
"""Batches of passes tried, each behind a longer hold, before the last one's reading stands."""


@dataclass(frozen=True, slots=True)
class GraphTimes:
    forward: float
    """Median device seconds of the forward replayed."""
    backward: float
    """Median device seconds of the whole backward replayed."""
    pool_bytes: int
    """Device memory the slot's pool reserved when captured (0 on CPU)."""


def graph_times(
    module: nn.Module,
    x: torch.Tensor,
    input_grad: bool,
    device: torch.device,
    options: ProfileOptions,
) -> GraphTimes:
    """`module`'s forward and whole backward replayed as CUDA graphs, for input `x`
    (`input_grad`: the backward also returns the input's gradient). On CPU (tests, with the
    graphs' stand-in) the same passes timed by the host's clock. Leaves the module's
    buffers and gradients as it found them. Raises RuntimeError (CUDA's capture errors
    among them) where the module can't be captured."""
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    buffers = list(module.buffers())
    copy = needs_input_copy(module) and input_grad

    def run(inp: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = torch.func.functional_call(
            module, weights, (inp.clone() if copy else inp,)
        )
        return out

    kept_buffers = [b.detach().clone() for b in buffers]
    kept_grads = {n: p.grad for n, p in params.items()}
    for p in params.values():  # the graphs add into gradients of their own, not these
        p.grad = None
    graphs = stage_graphs(run, params, buffers, device)
    cuda = device.type == "cuda"
    mark, seconds = _clock(cuda)
    try:
        graphs.capture(x, 1, input_grad)
        pool = graphs.pool_reserved
        grad_out = torch.randn_like(graphs.forward(0, x))
        graphs.backward(0, grad_out)
        lead = 0.0
        for _ in range(ATTEMPTS):
            devices.synchronize(device)
            held = mark()
            devices.hold(device, lead)
            began = time.perf_counter()
            marks = [mark()]
            for _ in range(options.warmup + options.repeats):
                graphs.forward(0, x)
                marks.append(mark())
                graphs.backward(0, grad_out)
                marks.append(mark())
            issued = time.perf_counter() - began
            devices.synchronize(device)
            if not cuda or seconds(held, marks[0]) >= issued:
                break
            lead = max(2 * lead, HIDE_LEAD * issued)
    finally:
        del graphs
        with torch.no_grad():
            for b, v in zip(buffers, kept_buffers, strict=True):
                b.copy_(v)
        for n, p in params.items():
            p.grad = kept_grads[n]
        if cuda:
            torch.cuda.empty_cache()  # the slot's pool
    kept = range(options.warmup, options.warmup + options.repeats)
    forward = [seconds(marks[2 * i], marks[2 * i + 1]) for i in kept]
    backward = [seconds(marks[2 * i + 1], marks[2 * i + 2]) for i in kept]
    return GraphTimes(robust(forward).median, robust(backward).median, pool)


def _clock(cuda: bool) -> tuple[Callable[[], object], Callable[[object, object], float]]:
    """A mark on the device's stream (CUDA events) or the host's clock, and the seconds
    between two marks."""

    def mark() -> object:
        if cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()

    def seconds(a: object, b: object) -> float:
        if cuda:
            assert isinstance(a, torch.cuda.Event) and isinstance(b, torch.cuda.Event)
            return float(a.elapsed_time(b)) / 1e3
        assert isinstance(a, float) and isinstance(b, float)
        return b - a

    return mark, seconds
