"""How the profiler measures: one block at a time in isolation (forward, B, W, whole backward,
saved and held bytes), the loss, the optimizer step and a split backward call's own cost.
The whole model in context is measured in `context`."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from pipecast.errors import ShapeError
from pipecast.measuring.profiler.hold import HIDE_LEAD
from pipecast.measuring.profiler.options import ProfileOptions
from pipecast.runtime import devices
from pipecast.runtime.backward import WeightWork, backward_full, backward_input, backward_weights
from pipecast.runtime.stage import needs_input_copy
from pipecast.runtime.weight_batch import run_group
from pipecast.values.models.summary import block_name
from pipecast.values.profile.stats import robust
from pipecast.values.profile.types import BATCHED_WEIGHT_GROUP


@contextlib.contextmanager
def precision(device: torch.device, options: ProfileOptions) -> Iterator[None]:
    if options.autocast and options.dtype != "fp32":
        with torch.autocast(device.type, dtype=devices.DTYPES[options.dtype]):
            yield
    else:
        yield


def storages(t: torch.Tensor) -> list[tuple[int, int]]:
    """(data pointer, bytes) of each storage `t` holds. A tensor subclass that wraps others
    (torchao's Float8 tensors, which a Float8 block saves for its backward) has no storage
    of its own, only its inner tensors'."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [s for name in names for s in storages(getattr(t, name))]
    s = t.untyped_storage()
    return [(s.data_ptr(), s.nbytes())]


def storage(t: torch.Tensor) -> tuple[int, int]:
    """`t`'s first storage and the bytes of all it holds (storages)."""
    held = storages(t)
    return held[0][0], sum(n for _, n in held)


class BlockRun:
    """One block at one micro-batch size, with its input fixed."""

    def __init__(
        self,
        block: nn.Module,
        x: torch.Tensor,
        index: int,
        device: torch.device,
        options: ProfileOptions,
    ) -> None:
        self.block, self.index, self.device, self.options = block, index, device, options
        self.params = [p for p in block.parameters() if p.requires_grad]
        self.leaf = x.detach().requires_grad_(index > 0 and x.is_floating_point())
        self.copy_input = needs_input_copy(block) and self.leaf.requires_grad

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        inp = self.leaf.clone() if self.copy_input else self.leaf
        try:
            with precision(self.device, self.options):
                out = self.block(inp)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            if "out of memory" in str(exc).lower():
                raise
            raise ShapeError(
                f"block {self.index} ({block_name(self.block)}) fails on input of shape "
                f"{tuple(self.leaf.shape)}: {str(exc).splitlines()[0]}"
            ) from None
        if not isinstance(out, torch.Tensor):
            raise ShapeError(
                f"block {self.index} ({block_name(self.block)}) must return one "
                f"tensor, got {type(out).__name__}"
            )
        return inp, out

    def stage_input(self) -> torch.Tensor | None:
        return self.leaf if self.leaf.requires_grad else None

    def clear_grads(self) -> None:
        for p in self.params:
            p.grad = None
        self.leaf.grad = None


def saved_storages(run: BlockRun, param_ptrs: set[int]) -> tuple[dict[int, int], torch.Tensor]:
    """Storages autograd saves in one forward of the block (ptr -> bytes), params excluded."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for ptr, nbytes in storages(t):
            if ptr not in param_ptrs and ptr != 0:
                saved[ptr] = nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, out = run.forward()
    return saved, out


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """No garbage collection while timing: a collection pass lands in whichever sample
    is running and lengthens it by milliseconds."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def workspace_floor(device: torch.device, dtype: torch.dtype) -> int:
    """Bytes the math libraries keep on `device` once a forward and a backward have run:
    cuBLAS's workspaces (per thread and stream; the backward has a thread of its own).
    Measured from empty where torch can free them, else what a fresh use adds (0 if this
    process had them already)."""
    if device.type != "cuda":
        return 0
    devices.clear_workspaces()
    return _grown(device, lambda: _use_workspaces(device, dtype))


def _grown(device: torch.device, work: Callable[[], None]) -> int:
    """Bytes still allocated on `device` after `work` than before it."""
    devices.synchronize(device)
    before = devices.allocated(device)
    work()
    devices.synchronize(device)
    return max(devices.allocated(device) - before, 0)


def _use_workspaces(device: torch.device, dtype: torch.dtype) -> None:
    """A tiny forward and backward through cuBLAS: its workspaces for the current stream,
    the calling thread's and autograd's."""
    w = torch.randn(64, 64, device=device, dtype=dtype, requires_grad=True)
    b = torch.zeros(64, device=device, dtype=dtype, requires_grad=True)
    x = torch.randn(32, 64, device=device, dtype=dtype)
    torch.autograd.backward((torch.nn.functional.linear(x, w, b) @ w).sum())


def kept_workspace(run: BlockRun, dtype: torch.dtype) -> int | None:
    """Bytes the math libraries keep for a stream once this block's forward and backward
    ran on it: cuBLAS's workspaces where the block calls cuBLAS (a Linear, attention), 0
    where it calls none (convolutions, norms) and on CPU. A rank keeps them once for its
    default stream, whatever its stages; a graphed stage once more for its capture stream.
    Measured from none; the default stream's are put back after, so the block peaks
    measured next never include them. The block's gradients are left as they were. None
    where torch can't free the workspaces to measure them."""
    if run.device.type != "cuda":
        return 0
    grads = [p.grad for p in run.params]
    run.clear_grads()
    try:
        devices.synchronize(run.device)
        if not devices.clear_workspaces():
            return None

        def passes() -> None:
            _, out = run.forward()
            if out.requires_grad:
                torch.autograd.backward(out, torch.ones_like(out))
            run.clear_grads()

        kept = _grown(run.device, passes)
        _use_workspaces(run.device, dtype)
        return kept
    finally:
        for p, g in zip(run.params, grads, strict=True):
            p.grad = g


INNER = BATCHED_WEIGHT_GROUP
"""Ops timed back to back per measurement: the device runs them without waiting for the
host between them, so launch and Python overheads of a lone op stay out of its time."""


def measure_block(run: BlockRun, grad_out: torch.Tensor) -> dict[str, float]:
    """Device and host seconds of one block's F, B, W and BW, its relative spread, and the
    bytes B holds for W; on a GPU, also the W of INNER micro-batches as one ("wb", per
    micro-batch; runtime.weight_batch): where a GPU computes small products below its speed,
    the planner weighs batching them (CPU profiles leave it out: it would cost every CPU
    profile a third more time for a gain GPUs show)."""
    dev, opts = run.device, run.options
    batched = dev.type == "cuda" and run.stage_input() is not None
    device: dict[str, list[float]] = {"f": [], "b": [], "w": [], "bw": []}
    host: dict[str, list[float]] = {"f": [], "b": [], "w": [], "bw": []}
    held = 0
    for rep in range(opts.warmup + opts.repeats):
        outs, t_f, h_f = devices.timed_with_host(
            dev, lambda: [run.forward()[1] for _ in range(INNER)]
        )

        def split_b(outs: list[torch.Tensor] = outs) -> list[WeightWork]:
            return [backward_input(o, grad_out, run.stage_input(), run.params)[1] for o in outs]

        works, t_b, h_b = devices.timed_with_host(dev, split_b)
        held = max(held, works[0].held_bytes)

        def weights(works: list[WeightWork] = works) -> None:
            backward_weights(works, dev)

        _, t_w, h_w = devices.timed_with_host(dev, weights)
        run.clear_grads()
        del outs, works
        outs2 = [run.forward()[1] for _ in range(INNER)]

        def full(outs2: list[torch.Tensor] = outs2) -> None:
            for o in outs2:
                backward_full(o, grad_out, run.stage_input(), run.params)

        _, t_bw, h_bw = devices.timed_with_host(dev, full)
        run.clear_grads()
        del outs2
        if batched:
            device.setdefault("wb", []).append(_batched_w(run, grad_out) / INNER)
        if rep >= opts.warmup:
            for key, t, h in (
                ("f", t_f, h_f),
                ("b", t_b, h_b),
                ("w", t_w, h_w),
                ("bw", t_bw, h_bw),
            ):
                device[key].append(t / INNER)
                host[key].append(h / INNER)
    if "wb" in device:
        device["wb"] = device["wb"][opts.warmup :]
    totals = [f + bw for f, bw in zip(device["f"], device["bw"], strict=True)]
    out = {k: robust(v).median for k, v in device.items()}
    # on a CPU the host does the work itself: there is no separate issue time to model
    cuda = dev.type == "cuda"
    out |= {f"host_{k}": robust(v).median if cuda else 0.0 for k, v in host.items()}
    out["spread"] = robust(totals).spread
    out["held"] = float(held)
    return out


def _batched_w(run: BlockRun, grad_out: torch.Tensor) -> float:
    """Device seconds of the W of INNER micro-batches run as one (after their untimed F and
    B)."""
    outs = [run.forward()[1] for _ in range(INNER)]
    works = [[backward_input(o, grad_out, run.stage_input(), run.params)[1]] for o in outs]
    _, seconds, _ = devices.timed_with_host(run.device, lambda: run_group(works, run.device))
    run.clear_grads()
    return seconds


def measure_optimizer(block: nn.Module, device: torch.device, options: ProfileOptions) -> float:
    """Seconds of one plain SGD step over `block`'s parameters (the runtime's default
    optimizer: one step per stage, updating all its tensors in one multi-tensor call)."""
    params = [p for p in block.parameters() if p.requires_grad]
    if not params:
        return 0.0
    saved = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(params, lr=0.0)
    times = [devices.timed(device, opt.step)[1] for _ in range(options.warmup + options.repeats)]
    with torch.no_grad():
        for p, s in zip(params, saved, strict=True):
            p.copy_(s)
            p.grad = None
    return robust(times[options.warmup :]).median


CHAIN = 8
"""Blocks in the chain whose B is timed against one block's to find a B call's own cost."""


def split_call(device: torch.device, dtype: torch.dtype, options: ProfileOptions) -> float:
    """Host seconds a split-backward B call costs beyond the work of what it covers. B is
    timed over one tiny ReLU (b1 = C + v) and over a chain of CHAIN of them (bK = C + K v):
    C = (K b1 - bK) / (K - 1). Zero on a CPU, where no host time is modelled."""
    if device.type != "cuda":
        return 0.0
    x = torch.randn(2, 8, device=device, dtype=dtype)
    host = []
    for k in (1, CHAIN):
        run = BlockRun(nn.Sequential(*[nn.ReLU() for _ in range(k)]), x, 1, device, options)
        out = run.forward()[1]
        with quiet_gc():
            host.append(measure_block(run, torch.ones_like(out))["host_b"])
    return max((CHAIN * host[0] - host[1]) / (CHAIN - 1), 0.0)


def optimizer_fixed(device: torch.device, dtype: torch.dtype, options: ProfileOptions) -> float:
    """Seconds of an SGD step over one tiny tensor: what every step costs whatever it
    updates (a stage pays it once, not once per block)."""
    return measure_optimizer(nn.Linear(1, 1, bias=False).to(device, dtype), device, options)


def measure_loss(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    output: torch.Tensor,
    target: torch.Tensor,
    device: torch.device,
    options: ProfileOptions,
) -> tuple[float, float]:
    """Device seconds of the loss's forward and backward on `output`, issued as eager
    PyTorch issues them (where the host binds, that is the host's issue time)."""
    forward, backward, _, _ = _loss_passes(loss_fn, output, target, device, options, hide=False)
    return forward, backward


def measure_loss_alone(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    output: torch.Tensor,
    target: torch.Tensor,
    device: torch.device,
    options: ProfileOptions,
) -> tuple[float, float, float, float]:
    """The loss's forward and backward as a graphed last stage runs them (eagerly, beside
    its graphs): device seconds with the host's issuing hidden behind a hold (at small
    micro-batches measure_loss reads the host's issue time), then host seconds issuing
    each. The first pass, unheld, sets the hold; it and the warm-up are not kept."""
    return _loss_passes(loss_fn, output, target, device, options, hide=True)


def _loss_passes(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    output: torch.Tensor,
    target: torch.Tensor,
    device: torch.device,
    options: ProfileOptions,
    *,
    hide: bool,
) -> tuple[float, float, float, float]:
    """Medians of the loss's device forward, device backward, host forward and host
    backward seconds; with `hide`, each behind a hold of HIDE_LEAD x the longest issue
    time so far."""
    skip = max(options.warmup, 1) if hide else options.warmup
    runs: list[tuple[float, float, float, float]] = []
    lead = 0.0
    for _ in range(skip + options.repeats):
        leaf = output.detach().requires_grad_(output.is_floating_point())
        devices.hold(device, lead)
        loss, t_f, h_f = devices.timed_with_host(device, partial(loss_fn, leaf, target))
        t_b = h_b = 0.0
        if leaf.requires_grad:
            devices.hold(device, lead)
            _, t_b, h_b = devices.timed_with_host(device, partial(torch.autograd.grad, loss, leaf))
        if hide:
            lead = max(lead, HIDE_LEAD * max(h_f, h_b))
        runs.append((t_f, t_b, h_f, h_b))
    kept = runs[skip:]
    f, b, hf, hb = (robust([r[i] for r in kept]).median for i in range(4))
    return f, b, hf, hb
