"""The profiler: measures every block of a model at several micro-batch sizes.

For each block and size it times forward, B (input gradient), W (weight gradient, through the
same split the runtime uses) and the whole backward, with warm-up and repeats, and takes the
robust median. Activation memory is measured, not derived: saved-tensor hooks see exactly what
autograd keeps, deduplicated by storage so a tensor two blocks keep is counted once. A model
too large for the device is profiled holding one block on it at a time.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn

from pipecast import devices
from pipecast.data.loss import loss_for
from pipecast.data.spec import DatasetSpec
from pipecast.data.synthetic import synthetic_batch
from pipecast.errors import ConfigError, DeviceError, ShapeError
from pipecast.models.summary import block_name
from pipecast.profile.stats import robust
from pipecast.profile.types import BlockCost, BlockProfile, Dtype, Profile
from pipecast.runtime.backward import (
    WeightWork,
    backward_full,
    backward_input,
    backward_weight,
)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOptions:
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    """Micro-batch sizes to measure; costs at other sizes are interpolated."""
    device: str = "cpu"
    dtype: Dtype = "fp32"
    """Parameter and activation dtype; with `autocast`, parameters stay fp32."""
    autocast: bool = False
    warmup: int = 2
    repeats: int = 7
    offload: bool | None = None
    """Hold one block on the device at a time (None: only when the model does not fit)."""
    in_situ: bool = True
    """Time blocks in context too: forward between events in one whole-model pass, and the
    whole backward shared out by each block's isolated share. Isolated timing alone charges
    every block a fresh autograd call; a stage backs all its blocks up in one."""
    seed: int = 0


@contextlib.contextmanager
def _precision(device: torch.device, options: ProfileOptions) -> Iterator[None]:
    if options.autocast and options.dtype != "fp32":
        with torch.autocast(device.type, dtype=devices.DTYPES[options.dtype]):
            yield
    else:
        yield


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _first_leaf(block: nn.Module) -> nn.Module:
    for module in block.modules():
        if not list(module.children()):
            return module
    return block


def needs_input_copy(block: nn.Module) -> bool:
    """Whether the block begins with an in-place op, which a leaf that requires grad (a
    received stage input) cannot feed; such inputs get a cheap copy first."""
    return bool(getattr(_first_leaf(block), "inplace", False))


class _BlockRun:
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
            with _precision(self.device, self.options):
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


def _saved_storages(run: _BlockRun, param_ptrs: set[int]) -> tuple[dict[int, int], torch.Tensor]:
    """Storages autograd saves in one forward of the block (ptr -> bytes), params excluded."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr, nbytes = _storage(t)
        if ptr not in param_ptrs and ptr != 0:
            saved[ptr] = nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, out = run.forward()
    return saved, out


INNER = 4
"""Ops timed back to back per measurement: the device runs them without waiting for the
host between them, so launch and Python overheads of a lone op stay out of its time."""


def _measure_block(
    run: _BlockRun, grad_out: torch.Tensor
) -> tuple[float, float, float, float, float, int]:
    """(forward, B, W, BW, relative spread, bytes held between B and W) of one block."""
    dev, opts = run.device, run.options
    samples: dict[str, list[float]] = {"f": [], "b": [], "w": [], "bw": []}
    held = 0
    for rep in range(opts.warmup + opts.repeats):
        outs, t_f = devices.timed(dev, lambda: [run.forward()[1] for _ in range(INNER)])

        def split_b(outs: list[torch.Tensor] = outs) -> list[WeightWork]:
            return [backward_input(o, grad_out, run.stage_input(), run.params)[1] for o in outs]

        works, t_b = devices.timed(dev, split_b)
        held = max(held, works[0].held_bytes)

        def weights(works: list[WeightWork] = works) -> None:
            for w in works:
                backward_weight(w)

        _, t_w = devices.timed(dev, weights)
        run.clear_grads()
        del outs, works
        outs2 = [run.forward()[1] for _ in range(INNER)]

        def full(outs2: list[torch.Tensor] = outs2) -> None:
            for o in outs2:
                backward_full(o, grad_out, run.stage_input(), run.params)

        _, t_bw = devices.timed(dev, full)
        run.clear_grads()
        del outs2
        if rep >= opts.warmup:
            for key, value in (("f", t_f), ("b", t_b), ("w", t_w), ("bw", t_bw)):
                samples[key].append(value / INNER)
    totals = [f + bw for f, bw in zip(samples["f"], samples["bw"], strict=True)]
    return (
        robust(samples["f"]).median,
        robust(samples["b"]).median,
        robust(samples["w"]).median,
        robust(samples["bw"]).median,
        robust(totals).spread,
        held,
    )


def _in_situ(
    blocks: list[nn.Module],
    x: torch.Tensor,
    target: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    options: ProfileOptions,
) -> tuple[list[float], float]:
    """Per-block forward seconds inside one whole-model pass, and the seconds of the whole
    backward (loss included)."""
    cuda = device.type == "cuda"

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

    forward: list[list[float]] = [[] for _ in blocks]
    backward: list[float] = []
    params = [p for b in blocks for p in b.parameters() if p.requires_grad]
    for rep in range(options.warmup + options.repeats):
        marks = [mark()]
        h = x
        with _precision(device, options):
            for block in blocks:
                h = block(h)
                marks.append(mark())
            loss = loss_fn(h, target)
        began = mark()
        torch.autograd.backward(loss)
        ended = mark()
        devices.synchronize(device)
        if rep >= options.warmup:
            for i in range(len(blocks)):
                forward[i].append(seconds(marks[i], marks[i + 1]))
            backward.append(seconds(began, ended))
        for p in params:
            p.grad = None
        del h, loss
    return [robust(f).median for f in forward], robust(backward).median


def _measure_optimizer(block: nn.Module, device: torch.device, options: ProfileOptions) -> float:
    params = [p for p in block.parameters() if p.requires_grad]
    if not params:
        return 0.0
    saved = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(params, lr=0.0, momentum=0.9)
    times = [devices.timed(device, opt.step)[1] for _ in range(options.warmup + options.repeats)]
    with torch.no_grad():
        for p, s in zip(params, saved, strict=True):
            p.copy_(s)
            p.grad = None
    return robust(times[options.warmup :]).median


def _fits(model: nn.Sequential, device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return 3 * param_bytes < devices.free_memory(device)


def profile_model(
    model: nn.Sequential,
    spec: DatasetSpec,
    options: ProfileOptions,
    *,
    model_name: str = "model",
    workload: dict[str, object] | None = None,
    progress: Progress | None = None,
) -> Profile:
    """Measure `model` block by block; `progress` is called once per (size, block)."""
    if not options.micro_batches or min(options.micro_batches) < 1:
        raise ConfigError(f"micro-batch sizes must be at least 1, got {options.micro_batches}")
    if options.repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {options.repeats}")
    device = devices.resolve(options.device)
    torch.manual_seed(options.seed)
    dtype = devices.DTYPES[options.dtype]
    if not options.autocast:
        model = model.to(dtype)
    offload = options.offload if options.offload is not None else not _fits(model, device)
    if not offload:
        model = model.to(device)
    loss_fn = loss_for(spec)
    blocks = list(model)
    costs: list[dict[int, BlockCost]] = [{} for _ in blocks]
    input_counted = [False] * len(blocks)
    optimizer_step = [0.0] * len(blocks)
    loss: dict[int, tuple[float, float]] = {}
    sizes = sorted(set(options.micro_batches))
    for mb in sizes:
        x, target = synthetic_batch(spec, mb, seed=options.seed, dtype=dtype)
        x, target = x.to(device), target.to(device)
        prev_saved_output = False
        for index, block in enumerate(blocks):
            if offload:
                block.to(device)
            try:
                param_ptrs = {_storage(p)[0] for p in block.parameters()}
                run = _BlockRun(block, x, index, device, options)
                devices.reset_peak(device)
                base = devices.allocated(device)
                saved, out = _saved_storages(run, param_ptrs)
                in_ptr, in_bytes = _storage(run.leaf)
                out_ptr, out_bytes = _storage(out)
                saves_input = in_ptr in saved
                saved_total = sum(saved.values())
                shared = saves_input and prev_saved_output
                prev_saved_output = out_ptr in saved
                grad_out = torch.randn_like(out)
                backward_full(out, grad_out, run.stage_input(), run.params)
                peak = max(devices.peak_allocated(device) - base - saved_total - out_bytes, 0)
                run.clear_grads()
                f, b, w, bw, spread, held = _measure_block(run, grad_out)
                if index == 0:  # the first stage never sends an input gradient
                    b, w, held = bw, 0.0, 0
                costs[index][mb] = BlockCost(
                    forward=f,
                    backward_input=b,
                    backward_weight=w,
                    backward=bw,
                    output_bytes=out.numel() * out.element_size(),
                    saved_bytes=saved_total - (in_bytes if shared else 0),
                    peak_bytes=peak,
                    spread=spread,
                    held_bytes=held,
                )
                input_counted[index] = saves_input and not shared
                if mb == sizes[0]:
                    optimizer_step[index] = _measure_optimizer(block, device, options)
                x = out.detach()
                del out, run, grad_out
            except torch.OutOfMemoryError:
                raise DeviceError(
                    f"block {index} ({block_name(block)}) at micro-batch {mb} does not fit in "
                    f"{devices.name(device)} ({devices.total_memory(device) / 2**30:.1f} GiB): "
                    "profile smaller micro-batches"
                ) from None
            finally:
                if offload:
                    block.to("cpu")
            if progress is not None:
                progress(f"micro-batch {mb}")
        loss[mb] = _measure_loss(loss_fn, x, target, device, options)
        if options.in_situ and not offload:
            first, _ = synthetic_batch(spec, mb, seed=options.seed, dtype=dtype)
            _rescale(
                costs,
                mb,
                *_in_situ(blocks, first.to(device), target, loss_fn, device, options),
                loss_backward=loss[mb][1],
            )
    return Profile(
        model=model_name,
        dataset=spec.name,
        workload=dict(workload or {}),
        device=devices.name(device),
        dtype=options.dtype,
        autocast=options.autocast,
        torch_version=torch.__version__,
        micro_batches=tuple(sizes),
        input_bytes_per_sample=_input_bytes(spec, dtype),
        blocks=tuple(
            BlockProfile(
                index=i,
                name=block_name(block),
                params=sum(p.numel() for p in block.parameters()),
                param_bytes=sum(p.numel() * p.element_size() for p in block.parameters()),
                input_counted=input_counted[i],
                costs=costs[i],
                optimizer_step=optimizer_step[i],
            )
            for i, block in enumerate(blocks)
        ),
        loss=loss,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def _rescale(
    costs: list[dict[int, BlockCost]],
    mb: int,
    forward: list[float],
    backward_total: float,
    *,
    loss_backward: float,
) -> None:
    """Forward times from context; the contextual backward shared out by each block's
    isolated share, keeping each block's B : W ratio."""
    isolated = sum(c[mb].backward for c in costs)
    scale = max(backward_total - loss_backward, 0.0) / isolated if isolated > 0 else 1.0
    for c, f in zip(costs, forward, strict=True):
        old = c[mb]
        bw = old.backward * scale
        split = old.backward_input + old.backward_weight
        b = bw * old.backward_input / split if split > 0 else bw
        c[mb] = replace(old, forward=f, backward=bw, backward_input=b, backward_weight=bw - b)


def _measure_loss(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    output: torch.Tensor,
    target: torch.Tensor,
    device: torch.device,
    options: ProfileOptions,
) -> tuple[float, float]:
    fwd, bwd = [], []
    for _ in range(options.warmup + options.repeats):
        leaf = output.detach().requires_grad_(output.is_floating_point())
        loss, t_f = devices.timed(device, partial(loss_fn, leaf, target))
        if leaf.requires_grad:
            _, t_b = devices.timed(device, partial(torch.autograd.grad, loss, leaf))
        else:
            t_b = 0.0
        fwd.append(t_f)
        bwd.append(t_b)
    return robust(fwd[options.warmup :]).median, robust(bwd[options.warmup :]).median


def _input_bytes(spec: DatasetSpec, dtype: torch.dtype) -> int:
    n = 1
    for d in spec.sample_shape:
        n *= d
    itemsize = 8 if spec.input_kind == "tokens" else torch.empty((), dtype=dtype).element_size()
    return n * itemsize


def measure_step(
    model: nn.Sequential,
    spec: DatasetSpec,
    micro_batch: int,
    options: ProfileOptions,
) -> float:
    """Median seconds of one whole-model forward + loss + backward at `micro_batch` (the
    reference the sum of per-block costs is checked against)."""
    device = devices.resolve(options.device)
    dtype = devices.DTYPES[options.dtype]
    if not options.autocast:
        model = model.to(dtype)
    model = model.to(device)
    loss_fn = loss_for(spec)
    x, target = synthetic_batch(spec, micro_batch, seed=options.seed, dtype=dtype)
    x, target = x.to(device), target.to(device)

    def step() -> None:
        with _precision(device, options):
            loss = loss_fn(model(x), target)
        torch.autograd.backward(loss)

    times = []
    for _ in range(options.warmup + options.repeats):
        model.zero_grad(set_to_none=True)
        times.append(devices.timed(device, step)[1])
    model.zero_grad(set_to_none=True)
    return robust(times[options.warmup :]).median
