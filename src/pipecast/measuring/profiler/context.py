"""The whole model in context: every block's forward and backward timed inside one
whole-model pass, and the isolated per-block costs rescaled to what the passes measured."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn

from pipecast.measuring.profiler.hold import Hold
from pipecast.measuring.profiler.measure import precision
from pipecast.measuring.profiler.options import ProfileOptions
from pipecast.runtime import devices
from pipecast.values.profile.stats import robust
from pipecast.values.profile.types import BlockCost


@dataclass(frozen=True, slots=True)
class Context:
    """One whole-model pass, timed per block: what a stage of these blocks costs in place."""

    forward: list[float]
    """Device seconds of each block's forward."""
    backward: float
    """Device seconds of the whole backward, the loss's included."""
    host_forward: list[float]
    """Host seconds issuing each block's forward."""
    host_backward: float
    """Host seconds issuing the whole backward (one autograd call)."""
    backward_blocks: list[float] | None = None
    """Device seconds of each block's backward inside the whole backward (None: a block's
    output took no gradient hook, so its boundary could not be marked)."""
    issue_hidden: bool = False
    """The kept passes ran behind a hold that outlasted the host's issuing of them
    (ProfileOptions.hide_issue on a GPU, and no pass waited on its device)."""

    def device_from(self, held: Context) -> Context:
        """These passes' host times with `held`'s device times, where `held` hid the host's
        issuing. Its own host times are not the host's alone: behind a held device CUDA's
        launch queue fills and the host waits for room, reading well above the plain
        passes' host time (docs/decisions.md, "Device times with the issuing hidden")."""
        if not held.issue_hidden:
            return self
        return replace(
            self,
            forward=held.forward,
            backward=held.backward,
            backward_blocks=held.backward_blocks or self.backward_blocks,
            issue_hidden=True,
        )


def in_situ(
    blocks: list[nn.Module],
    x: torch.Tensor,
    target: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    options: ProfileOptions,
) -> Context:
    """Device and host seconds of every block's forward inside one whole-model pass, and of
    the whole backward and each block's share of it (marked where the gradient of each
    block's output is ready: autograd hooks record an event on the backward's stream)."""
    context = _passes(blocks, x, target, loss_fn, device, options, hide=False)
    assert context is not None  # only hidden passes can fail
    return context


def in_situ_hidden(
    blocks: list[nn.Module],
    x: torch.Tensor,
    target: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    options: ProfileOptions,
) -> Context | None:
    """As in_situ, each pass behind a hold that lets the host issue all of it first
    (ProfileOptions.hide_issue; on a GPU): their device times are the device's alone.
    None where the issuing could not be hidden."""
    return _passes(blocks, x, target, loss_fn, device, options, hide=device.type == "cuda")


def _passes(
    blocks: list[nn.Module],
    x: torch.Tensor,
    target: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    options: ProfileOptions,
    *,
    hide: bool,
) -> Context | None:
    # Passes alternate: one marks every block, the next only the forward's two ends. The
    # marks cost the host time, and where the host binds they lengthen the forward; the
    # per-block shares come from the marked passes, the total from the plain ones. Gradients
    # accumulate from pass to pass, as they do over a step's micro-batches. A whole-model pass
    # is cheap next to the per-block runs: four times the samples, since at small
    # micro-batches these passes are host-bound and noisier.
    # With `hide`, a kept pass whose hold ended before its host had issued all of it is
    # run again with a longer hold (up to as many retries as passes). A pass whose host
    # waits on its device can't be hidden: when the longest hold falls short, or the
    # retries run out, there is no context (the profiler keeps its plain passes').
    mark, seconds = devices.clock(device)
    readings = _Readings(len(blocks))
    hold = Hold()  # how long the device is held before a pass, with `hide`
    passes = 2 * (options.warmup + 1 + 2 * options.repeats)
    rep = retries = 0
    failed = False
    while rep < passes:
        marked = rep % 2 == 0
        run = _one_pass(blocks, x, target, loss_fn, device, options, mark, marked, hold, hide)
        keep = rep > 2 * options.warmup + 1
        if hide:
            assert run.held is not None
            hidden = hold.after(
                issued=run.host_ended - run.clock[0], held=seconds(run.held, run.marks[0])
            )
            if hold.given_up or (keep and not hidden and retries == passes):
                failed = True
                break
            if keep and not hidden:
                retries += 1
                continue
        rep += 1
        if keep:
            readings.record(run, marked, seconds)
        del run
    for b in blocks:
        for p in b.parameters():
            p.grad = None
    return None if failed else readings.context(device.type == "cuda", hide)


def _one_pass(
    blocks: list[nn.Module],
    x: torch.Tensor,
    target: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    options: ProfileOptions,
    mark: Callable[[], object],
    marked: bool,
    hold: Hold,
    hide: bool,
) -> _Pass:
    """A whole-model forward, loss and backward; marked: an event after every block and a
    gradient hook on every block's output, else marks at the forward's two ends. With
    `hide`, the device is first held for `hold.lead` seconds."""
    held = None
    if hide:
        held = mark()
        devices.hold(device, hold.lead)
    marks, clock = [mark()], [time.perf_counter()]
    ready: dict[int, object] = {}  # block -> when its output's gradient was ready
    h = x
    with precision(device, options):
        for i, block in enumerate(blocks):
            h = block(h)
            if marked:
                marks.append(mark())
                clock.append(time.perf_counter())
                if h.requires_grad:
                    h.register_hook(partial(_ready, ready, i, mark))
        if not marked:
            marks.append(mark())
            clock.append(time.perf_counter())
        loss = loss_fn(h, target)
    began, host_began = mark(), time.perf_counter()
    torch.autograd.backward(loss)
    host_ended, ended = time.perf_counter(), mark()
    devices.synchronize(device)
    return _Pass(marks, clock, ready, began, host_began, host_ended, ended, held)


class _Readings:
    """The kept passes' readings, block by block (marked passes) and whole (plain ones)."""

    def __init__(self, blocks: int) -> None:
        self.forward: list[list[float]] = [[] for _ in range(blocks)]
        self.host_forward: list[list[float]] = [[] for _ in range(blocks)]
        self.backward_blocks: list[list[float]] = [[] for _ in range(blocks)]
        self.whole: list[float] = []
        self.host_whole: list[float] = []
        self.backward: list[float] = []
        self.host_backward: list[float] = []

    def record(self, run: _Pass, marked: bool, seconds: Callable[[object, object], float]) -> None:
        n = len(self.forward)
        if not marked:
            self.whole.append(seconds(run.marks[0], run.marks[1]))
            self.host_whole.append(run.clock[1] - run.clock[0])
            self.backward.append(seconds(run.began, run.ended))
            self.host_backward.append(run.host_ended - run.host_began)
            return
        for i in range(n):
            self.forward[i].append(seconds(run.marks[i], run.marks[i + 1]))
            self.host_forward[i].append(run.clock[i + 1] - run.clock[i])
        if len(run.ready) == n:  # block i's backward: from its output's gradient to its
            # input's (the previous block's output's; the end for block 0)
            bounds = [run.ended, *(run.ready[i] for i in range(n))]
            for i in range(n):
                self.backward_blocks[i].append(seconds(bounds[i + 1], bounds[i]))

    def context(self, cuda: bool, hide: bool) -> Context:
        n = len(self.forward)
        host_forward = [robust(f).median for f in self.host_forward]
        return Context(
            forward=shares([robust(f).median for f in self.forward], robust(self.whole).median),
            backward=robust(self.backward).median,
            host_forward=shares(host_forward, robust(self.host_whole).median)
            if cuda
            else [0.0] * n,
            host_backward=robust(self.host_backward).median if cuda else 0.0,
            backward_blocks=[robust(b).median for b in self.backward_blocks]
            if all(self.backward_blocks)
            else None,
            issue_hidden=hide,
        )


@dataclass(frozen=True, slots=True)
class _Pass:
    """One whole-model pass's marks (device events, or perf_counter on a CPU) and host clock
    readings."""

    marks: list[object]
    clock: list[float]
    ready: dict[int, object]
    began: object
    host_began: float
    host_ended: float
    ended: object
    held: object | None = None
    """A mark before the device was held (hide_issue), else None."""


def across_windows(windows: list[Context]) -> Context:
    """One context from plain passes taken in several windows spread over a profile: each
    reading's median over the windows. A host runs in spells seconds long, a pass's host
    time sitting at one level for a few seconds and then at another (docs/decisions.md,
    "Windows of host readings"), and one window's passes, a second or two, see one spell;
    the median of windows far apart sees the level the host keeps. Blocks are marked in
    every window or the result has none."""
    if not windows:
        raise ValueError("across_windows() needs at least one context")
    if len(windows) == 1:
        return windows[0]

    mid = statistics.median

    def each(lists: list[list[float]]) -> list[float]:
        return [mid(column) for column in zip(*lists, strict=True)]

    marked = [w.backward_blocks for w in windows]
    return Context(
        forward=each([w.forward for w in windows]),
        backward=mid([w.backward for w in windows]),
        host_forward=each([w.host_forward for w in windows]),
        host_backward=mid([w.host_backward for w in windows]),
        backward_blocks=each([m for m in marked if m is not None])
        if all(m is not None for m in marked)
        else None,
        issue_hidden=all(w.issue_hidden for w in windows),
    )


def in_place(plain: dict[int, Context], held: dict[int, Context]) -> dict[int, Context]:
    """Per micro-batch size, the context a profile keeps: the plain passes' host times, and
    device times from the passes behind a hold where those hid the issuing at every size
    (device times interpolate between sizes, so they come from one kind of pass). A model
    with a size whose passes could not be hidden (its host waited on its device, as GPT's,
    ResNet-50's and ResNet-152's can) keeps the plain passes' device times."""
    if held.keys() != plain.keys() or not all(c.issue_hidden for c in held.values()):
        return dict(plain)
    return {size: plain[size].device_from(held[size]) for size in plain}


def _ready(
    ready: dict[int, object], index: int, mark: Callable[[], object], grad: torch.Tensor
) -> None:
    """Gradient hook: the gradient of block `index`'s output is ready now (the first time;
    an in-place op after the block hooks the same tensor twice)."""
    ready.setdefault(index, mark())


def shares(parts: list[float], total: float) -> list[float]:
    """`parts` scaled to add up to `total` (isolated or per-block readings to what a whole
    pass measured)."""
    measured = sum(parts)
    return [p * total / measured for p in parts] if measured > 0 else parts


def rescale(
    costs: list[dict[int, BlockCost]],
    size: int,
    context: Context,
    *,
    loss_backward: float,
) -> None:
    """Forward times from context; the contextual backward shared out by each block's share
    of it as marked in context (by its isolated share where it could not be marked),
    keeping each block's B : W ratio from isolation. Host times likewise for the forward
    and the whole backward: a stage issues its blocks' backward in one autograd call, not
    one per block as they were timed alone. The split backward's host times stay as timed
    alone: its graph walk and per-weight calls cost per block wherever they run, and a
    stage's B call pays its own fixed cost once (Profile.host_split_call). A contextual
    backward no longer than the loss's own (the two read apart while something else took
    the cores) says nothing of the blocks: they keep their backward as timed alone rather
    than none at all."""
    isolated = [c[size].backward for c in costs]
    total = context.backward - loss_backward
    if total <= 0:
        total = sum(isolated)
    backward = shares(context.backward_blocks or isolated, total)
    host_isolated = sum(c[size].host_backward for c in costs)
    host_scale = context.host_backward / host_isolated if host_isolated > 0 else 1.0
    for c, f, hf, bw in zip(costs, context.forward, context.host_forward, backward, strict=True):
        old = c[size]
        split = old.backward_input + old.backward_weight
        # an empty W stays exactly empty (the first block does all its backward in B)
        b = bw * old.backward_input / split if split > 0 and old.backward_weight > 0 else bw
        c[size] = replace(
            old,
            forward=f,
            backward=bw,
            backward_input=b,
            backward_weight=bw - b,
            host_forward=hf,
            host_backward=old.host_backward * host_scale,
        )
