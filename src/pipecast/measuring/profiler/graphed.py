"""A model's device times as CUDA graph replays: what it costs a graphed stage's device.

A graphed stage (`RunConfig.cuda_graphs`, pipecast.runtime.graphs) issues its forward and
its whole backward with one launch each, so its device runs them at its own pace however
slowly the host issues ops. The eager profile's device times can't show that pace where
the host binds: a block's kernels there run as fast as they are issued, and passes behind a
hold (ProfileOptions.hide_issue) are given up where the host waits on its device, as it
does for larger models (docs/decisions.md, "Device times with the issuing hidden").

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
from dataclasses import dataclass, replace

import torch
from torch import nn

from pipecast.measuring.profiler.context import shares
from pipecast.measuring.profiler.hold import Hold
from pipecast.measuring.profiler.measure import measure_loss_alone
from pipecast.measuring.profiler.options import ProfileOptions
from pipecast.measuring.profiler.replay import stage_graphs
from pipecast.runtime import devices
from pipecast.runtime.graphs import stand_in
from pipecast.runtime.stage import needs_input_copy
from pipecast.values.models.summary import block_name
from pipecast.values.profile.stats import robust
from pipecast.values.profile.types import BlockCost

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
    mark, seconds = devices.clock(device)
    try:
        graphs.capture(x, 1, input_grad)
        pool = graphs.pool_reserved
        grad_out = torch.randn_like(graphs.forward(0, x))
        graphs.backward(0, grad_out)
        hold = Hold()  # grows after each batch of passes its hold did not hide
        for _ in range(ATTEMPTS):
            devices.synchronize(device)
            held = mark()
            devices.hold(device, hold.lead)
            began = time.perf_counter()
            marks = [mark()]
            for _ in range(options.warmup + options.repeats):
                graphs.forward(0, x)
                marks.append(mark())
                graphs.backward(0, grad_out)
                marks.append(mark())
            issued = time.perf_counter() - began
            devices.synchronize(device)
            if not cuda or hold.after(issued=issued, held=seconds(held, marks[0])):
                break
            if hold.given_up:  # the host waits on its device: the last reading stands
                break
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


class GraphRecorder:
    """The profiler's graph replay times of one model: every block at every size, shared out
    by the whole model's graph; the loss beside them; each block's pool and the whole
    model's. Given up, with the reason, at the first capture that fails (the profile then
    has no graph times)."""

    def __init__(self, blocks: int, options: ProfileOptions, device: torch.device) -> None:
        self.enabled = options.graph_times and not options.autocast and available(device)
        self.failure = ""
        self.times: list[dict[int, tuple[float, float]]] = [{} for _ in range(blocks)]
        self.block_pools: list[dict[int, int]] = [{} for _ in range(blocks)]
        self.pool: dict[int, int] = {}
        self.loss: dict[int, tuple[float, float, float, float]] = {}
        self.options, self.device = options, device

    def block(self, index: int, block: nn.Module, x: torch.Tensor, input_grad: bool) -> None:
        """Block `index` alone, for its input `x`."""
        if not self.enabled:
            return
        try:
            g = graph_times(block, x, input_grad, self.device, self.options)
        except RuntimeError as exc:  # CUDA's capture errors and out of memory among them
            self._give_up(f"block {index} ({block_name(block)})", exc)
            return
        self.times[index][x.shape[0]] = (g.forward, g.backward)
        self.block_pools[index][x.shape[0]] = g.pool_bytes

    def whole(self, blocks: list[nn.Module], x: torch.Tensor) -> None:
        """The whole model as one graph for the model's input `x`, shared out over the blocks
        in their graphed proportions: a block alone pays a launch and an input copy that a
        stage of many blocks pays once."""
        if not self.enabled:
            return
        size = x.shape[0]
        try:
            whole = graph_times(nn.Sequential(*blocks), x, False, self.device, self.options)
        except RuntimeError as exc:
            self._give_up(f"the whole model at micro-batch {size}", exc)
            return
        self.pool[size] = whole.pool_bytes
        parts = [t[size] for t in self.times]
        forward = shares([f for f, _ in parts], whole.forward)
        backward = shares([b for _, b in parts], whole.backward)
        for t, f, b in zip(self.times, forward, backward, strict=True):
            t[size] = (f, b)

    def loss_fn(
        self,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        output: torch.Tensor,
        target: torch.Tensor,
    ) -> None:
        """The loss on the last block's `output`, as a graphed last stage runs it (eagerly)."""
        if self.enabled:
            self.loss[output.shape[0]] = measure_loss_alone(
                loss_fn, output, target, self.device, self.options
            )

    def apply(self, costs: list[dict[int, BlockCost]]) -> None:
        """Put the blocks' graph times into their costs."""
        if not self.enabled:
            return
        for c, t, pools in zip(costs, self.times, self.block_pools, strict=True):
            for size, (f, b) in t.items():
                c[size] = replace(
                    c[size], graph_forward=f, graph_backward=b, graph_pool=pools.get(size, 0)
                )

    def _give_up(self, where: str, exc: BaseException) -> None:
        text = str(exc).strip()
        first = text.splitlines()[0][:300] if text else ""
        self.enabled, self.failure = False, f"{where}: {type(exc).__name__}: {first}"


def available(device: torch.device) -> bool:
    """CUDA graphs on a GPU; on CPU the graphs' stand-in where tests ask for it."""
    return device.type == "cuda" or stand_in()
