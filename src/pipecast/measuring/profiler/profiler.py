"""The profiler: measures every block of a model at several micro-batch sizes.

For each block and size it times forward, B (input gradient), W (weight gradient, through the
same split the runtime uses) and the whole backward, with warm-up and repeats, and takes the
robust median. Activation memory is measured, not derived: saved-tensor hooks see exactly what
autograd keeps, deduplicated by storage so a tensor two blocks keep is counted once. A model
too large for the device is profiled holding one block on it at a time.
"""

from __future__ import annotations

import datetime
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from pipecast.errors import ConfigError, DeviceError
from pipecast.measuring import hostspeed
from pipecast.measuring.profiler.context import (
    Context,
    across_windows,
    in_place,
    in_situ,
    in_situ_hidden,
    rescale,
)
from pipecast.measuring.profiler.graphed import GraphRecorder
from pipecast.measuring.profiler.measure import (
    BlockRun,
    kept_workspace,
    measure_block,
    measure_loss,
    measure_optimizer,
    optimizer_fixed,
    precision,
    quiet_gc,
    saved_storages,
    split_call,
    storage,
    workspace_floor,
)
from pipecast.measuring.profiler.options import ProfileOptions
from pipecast.measuring.profiler.selective import selective_bytes
from pipecast.measuring.profiler.tensor_parallel import sharded_model, with_tensor_parallel
from pipecast.runtime import compiled, devices, float8
from pipecast.runtime.backward import backward_full
from pipecast.values.data.loss import loss_for
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models.summary import block_name
from pipecast.values.profile.flops import forward_flops, with_forward_flops
from pipecast.values.profile.host_readings import HostReadings
from pipecast.values.profile.stats import robust
from pipecast.values.profile.types import (
    SMALL_REQUEST,
    BlockCost,
    BlockProfile,
    Profile,
)

__all__ = ["ProfileOptions", "measure_step", "profile_model"]

Progress = Callable[[str], None]


HOST_MODELLED = ("cuda",)
"""Device types whose profiles time the host apart from the device (on a CPU the host does
the work itself, and a profile's host costs are 0): only they read the host in
ProfileOptions.host_windows windows, a CPU in one."""


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
    """Measure `model` block by block; `progress` is called once per (size, block). On a GPU
    the host stays on the GPU's NUMA node meanwhile, as the runtime's ranks do. Each block's
    forward FLOPs are counted beside, before anything runs (values.profile.flops)."""
    flops = forward_flops(list(model), spec)
    with devices.pinned(devices.resolve(options.device)):
        profile = _profile_model(
            model, spec, options, model_name=model_name, workload=workload, progress=progress
        )
        profile = with_forward_flops(profile, flops)  # before the TP ranks copy its blocks
        for degree in options.tensor_parallel:
            sharded = sharded_model(model, degree)
            ranks = _profile_model(
                sharded,
                spec,
                replace(options, graph_times=False, tensor_parallel=()),
                model_name=model_name,
                workload=workload,
                progress=progress,
            )
            profile = with_tensor_parallel(profile, ranks, model, degree)
        return profile


def quick_profile(
    model: nn.Sequential,
    spec: DatasetSpec,
    micro_batch: int,
    *,
    device: str,
    dtype: str,
    autocast: bool,
    name: str = "model",
) -> Profile:
    """A few repeats at one size: enough to balance a run's stages, seconds to take."""
    options = ProfileOptions(
        micro_batch_sizes=(micro_batch,),
        device=device,
        dtype=dtype,  # type: ignore[arg-type]
        autocast=autocast,
        warmup=1,
        repeats=3,
    )
    return profile_model(model, spec, options, model_name=name)


def _profile_model(
    model: nn.Sequential,
    spec: DatasetSpec,
    options: ProfileOptions,
    *,
    model_name: str,
    workload: dict[str, object] | None,
    progress: Progress | None,
) -> Profile:
    if not options.micro_batch_sizes or min(options.micro_batch_sizes) < 1:
        raise ConfigError(f"micro-batch sizes must be at least 1, got {options.micro_batch_sizes}")
    if options.repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {options.repeats}")
    if options.host_windows < 1:
        raise ConfigError(f"host windows must be at least 1, got {options.host_windows}")
    run = _Profiling(model, spec, options, progress)
    if run.windows > 1:
        _check_shapes(run.blocks, run.whole_batch(run.sizes[0])[0], run.device, options)
    for size in run.sizes:  # before the first window's passes, which would compile them
        run.compile_pass(size)
    if run.windows > 1:
        run.host_window()
    for size in run.sizes:
        run.measure_size(size)
    for _ in range(run.windows - 2):
        run.host_window()
    return run.assemble(model_name, workload)


class _Profiling:
    """One profiling of a model: what its passes share, and the steps that fill it in."""

    def __init__(
        self,
        model: nn.Sequential,
        spec: DatasetSpec,
        options: ProfileOptions,
        progress: Progress | None,
    ) -> None:
        self.spec, self.options, self.progress = spec, options, progress
        self.device = device = devices.resolve(options.device)
        torch.manual_seed(options.seed)
        self.dtype = dtype = devices.DTYPES[options.dtype]
        if not options.autocast:
            model = model.to(dtype)
        self.offload = options.offload if options.offload is not None else not _fits(model, device)
        self.in_context = options.in_situ and not self.offload  # whole-model passes
        # windows beyond the size's own turn only read the host, which only a GPU's profile
        # models
        in_windows = device.type in HOST_MODELLED and self.in_context
        self.windows = options.host_windows if in_windows else 1
        if not self.offload:
            model = model.to(device)
        _execution(model, options)
        self.loss_fn = compiled.compile_loss(loss_for(spec), options.compile)
        self.compile_seconds = 0.0
        self.blocks = blocks = list(model)
        self.costs: list[dict[int, BlockCost]] = [{} for _ in blocks]
        self.input_counted = [False] * len(blocks)
        self.optimizer_step = [0.0] * len(blocks)
        self.kept: list[int | None] = [None] * len(blocks)  # library workspaces, first size
        self.loss: dict[int, tuple[float, float]] = {}
        self.sizes = sorted(set(options.micro_batch_sizes))
        self.floor = workspace_floor(device, dtype)
        self.fixed_step = optimizer_fixed(device, dtype, options)
        self.b_call = split_call(device, dtype, options)
        self.host_speed, self.host_issue = [hostspeed.reference()], [hostspeed.issue(device)]
        self.plain_passes: dict[int, list[Context]] = {size: [] for size in self.sizes}
        """Per size, per window: whole-model passes."""
        self.size_issue: dict[int, float] = {}
        """Per size: hostspeed.issue() beside its host readings."""
        self.held_passes: dict[int, Context] = {}
        """Per size: passes behind a hold (ProfileOptions.hide_issue)."""
        self.hiding = options.hide_issue and device.type == "cuda"
        self.graphs = GraphRecorder(len(blocks), options, device)  # graph replay times

    def whole_batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch the whole-model passes at `size` run on, on the device."""
        first, target = synthetic_batch(self.spec, size, seed=self.options.seed, dtype=self.dtype)
        first = first.to(self.device)
        if self.options.channels_last and first.dim() == 4:
            first = first.contiguous(memory_format=torch.channels_last)
        return first, target.to(self.device)

    def compile_pass(self, size: int) -> None:
        """One forward and backward of the whole model at `size` before anything is timed:
        where the blocks are compiled, this compiles them (Profile.compile_seconds)."""
        if self.options.compile == "off" or self.offload:
            return
        x, target = self.whole_batch(size)
        began = time.perf_counter()
        with precision(self.device, self.options):
            loss = self.loss_fn(nn.Sequential(*self.blocks)(x), target)
        torch.autograd.backward(loss)
        for block in self.blocks:
            block.zero_grad(set_to_none=True)
        devices.synchronize(self.device)
        self.compile_seconds += time.perf_counter() - began

    def _in_situ(self, size: int) -> Context:
        x_in, target = self.whole_batch(size)
        return in_situ(self.blocks, x_in, target, self.loss_fn, self.device, self.options)

    def host_window(self) -> None:
        """Plain whole-model passes at every size, for the host's readings from a window
        away from each size's own turn (ProfileOptions.host_windows)."""
        for size in self.sizes:
            with quiet_gc():
                self.plain_passes[size].append(self._in_situ(size))
        self.host_issue.append(hostspeed.issue(self.device))

    def measure_size(self, size: int) -> None:
        """Every block at `size` in isolation, the loss, then the whole-model passes."""
        gc.collect()
        x, target = self.whole_batch(size)
        prev_saved_output = False
        for index, block in enumerate(self.blocks):
            if self.offload:
                block.to(self.device)
            try:
                x, prev_saved_output = self._measure_block(index, block, x, size, prev_saved_output)
            except torch.OutOfMemoryError:
                raise DeviceError(
                    f"block {index} ({block_name(block)}) at micro-batch {size} does not fit "
                    f"in {devices.name(self.device)} "
                    f"({devices.total_memory(self.device) / 2**30:.1f} GiB): "
                    "profile smaller micro-batches"
                ) from None
            finally:
                if self.offload:
                    block.to("cpu")
            if self.progress is not None:
                self.progress(f"micro-batch {size}")
        self.loss[size] = measure_loss(self.loss_fn, x, target, self.device, self.options)
        self.graphs.loss_fn(self.loss_fn, x, target)
        self.host_speed.append(hostspeed.reference())
        self.host_issue.append(hostspeed.issue(self.device))
        self.size_issue[size] = self.host_issue[-1]
        if self.in_context:
            self._whole_passes(size)

    def _measure_block(
        self, index: int, block: nn.Module, x: torch.Tensor, size: int, prev_saved_output: bool
    ) -> tuple[torch.Tensor, bool]:
        """Block `index` at `size` on input `x`: its costs and memory; (its output, whether
        autograd saved that output)."""
        device, options = self.device, self.options
        param_ptrs = {storage(p)[0] for p in block.parameters()}
        run = BlockRun(block, x, index, device, options)
        if size == self.sizes[0]:
            self.kept[index] = kept_workspace(run, self.dtype)
        devices.reset_peak(device)
        base = devices.allocated(device)
        saved, out = saved_storages(run, param_ptrs)
        in_ptr, in_bytes = storage(run.leaf)
        out_ptr, out_bytes = storage(out)
        saves_input = in_ptr in saved
        saved_total = sum(saved.values())
        shared = saves_input and prev_saved_output
        grad_out = torch.randn_like(out)
        backward_full(out, grad_out, run.stage_input(), run.params)
        peak = max(devices.peak_allocated(device) - base - saved_total - out_bytes, 0)
        run.clear_grads()
        with quiet_gc():
            m = measure_block(run, grad_out)
        b, w, held = m["b"], m["w"], int(m["held"])
        hb, hw = m["host_b"], m["host_w"]
        if index == 0:  # the first stage never sends an input gradient
            b, w, held, hb, hw = m["bw"], 0.0, 0, m["host_bw"], 0.0
        self.costs[index][size] = BlockCost(
            forward=m["f"],
            backward_input=b,
            backward_weight=w,
            batched_weight=m.get("wb", 0.0) if w else 0.0,
            backward=m["bw"],
            output_bytes=out.numel() * out.element_size(),
            saved_bytes=saved_total - (in_bytes if shared else 0),
            peak_bytes=peak,
            spread=m["spread"],
            held_bytes=held,
            selective_bytes=selective_bytes(run),
            host_forward=m["host_f"],
            host_backward_input=hb,
            host_backward_weight=hw,
            host_backward=m["host_bw"],
        )
        self.input_counted[index] = saves_input and not shared
        self.graphs.block(index, block, run.leaf.detach(), run.leaf.requires_grad)
        if size == self.sizes[0]:
            step = measure_optimizer(block, device, options)
            self.optimizer_step[index] = max(step - self.fixed_step, 0.0) if step else 0.0
        return out.detach(), out_ptr in saved

    def _whole_passes(self, size: int) -> None:
        """The whole model's passes at `size`: plain, behind a hold, and as graphs."""
        blocks, device, options = self.blocks, self.device, self.options
        x_in, target = self.whole_batch(size)
        with quiet_gc():
            self.plain_passes[size].append(
                in_situ(blocks, x_in, target, self.loss_fn, device, options)
            )
            if self.hiding:
                behind = in_situ_hidden(blocks, x_in, target, self.loss_fn, device, options)
                if behind is None:  # one size not hidden keeps the plain device times
                    self.hiding = False  # at every size (in_place): no more held passes
                else:
                    self.held_passes[size] = behind
            self.graphs.whole(blocks, x_in)
        after = hostspeed.issue(device)  # the passes' host times lie between the two
        self.size_issue[size] = statistics.mean([self.size_issue[size], after])

    def assemble(self, model_name: str, workload: dict[str, object] | None) -> Profile:
        """The Profile of everything measured, each size's block times rescaled to the
        whole-model passes (context.rescale)."""
        plain = {size: across_windows(w) for size, w in self.plain_passes.items() if w}
        contexts = in_place(plain, self.held_passes)
        for size, context in contexts.items():
            rescale(self.costs, size, context, loss_backward=self.loss[size][1])
        self.graphs.apply(self.costs)
        graphs, device, spec = self.graphs, self.device, self.spec
        return Profile(
            model=model_name,
            dataset=spec.name,
            workload=dict(workload or {}),
            device=devices.name(device),
            dtype=self.options.dtype,
            autocast=self.options.autocast,
            torch_version=torch.__version__,
            micro_batch_sizes=tuple(self.sizes),
            input_bytes_per_sample=_input_bytes(spec, self.dtype),
            target_bytes_per_sample=spec.target_bytes(
                torch.empty((), dtype=self.dtype).element_size()
            ),
            blocks=tuple(self._block_profile(i, block) for i, block in enumerate(self.blocks)),
            loss=self.loss,
            loss_alone=graphs.loss if graphs.enabled else {},
            graph_pool=graphs.pool if graphs.enabled else {},
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            floor_bytes=self.floor,
            optimizer_fixed=self.fixed_step,
            host=self._host_readings(),
            issue_hidden=bool(contexts) and all(c.issue_hidden for c in contexts.values()),
            graph_times=graphs.enabled,
            graph_failure=graphs.failure,
            compiled=self.options.compile,
            compile_seconds=self.compile_seconds,
            channels_last=self.options.channels_last,
            float8=self.options.float8,
        )

    def _block_profile(self, i: int, block: nn.Module) -> BlockProfile:
        params = list(block.parameters())
        return BlockProfile(
            index=i,
            name=block_name(block),
            params=sum(p.numel() for p in params),
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            input_counted=self.input_counted[i],
            costs=self.costs[i],
            optimizer_step=self.optimizer_step[i],
            param_tensors=sum(1 for p in params if p.requires_grad),
            buffer_tensors=sum(1 for _ in block.buffers()),
            kept_workspace=self.kept[i],
            large_param_bytes=sum(
                n for p in params if (n := p.numel() * p.element_size()) > SMALL_REQUEST
            ),
        )

    def _host_readings(self) -> HostReadings:
        return HostReadings(
            split_call=self.b_call,
            reference=statistics.median(self.host_speed),
            issue=statistics.median(self.host_issue),
            machine=hostspeed.machine(),
            cpu=hostspeed.cpu_model(),
            size_issue=self.size_issue,
            windows=self.windows if self.in_context else 0,
            window_host={
                size: tuple(sum(c.host_forward) + c.host_backward for c in w)
                for size, w in self.plain_passes.items()
                if w
            },
        )


def _execution(model: nn.Sequential, options: ProfileOptions) -> None:
    """Run `model`'s blocks as the options say the runtime will (StageModule does the same):
    channels-last, Float8 Linears, compiled with a split backward."""
    if options.channels_last:
        model.to(memory_format=torch.channels_last)
    if options.float8:
        float8.convert(model)
    if options.compile != "off":
        compiled.compile_blocks(model, split=True, budget=options.compile_budget)


def _check_shapes(
    blocks: list[nn.Module], x: torch.Tensor, device: torch.device, options: ProfileOptions
) -> None:
    """One forward block by block from `x`, without gradients: a block that fails on its
    input raises ShapeError naming it, as the per-block runs would, before any whole-model
    pass."""
    with torch.no_grad():
        for index, block in enumerate(blocks):
            _, x = BlockRun(block, x, index, device, options).forward()


def _input_bytes(spec: DatasetSpec, dtype: torch.dtype) -> int:
    itemsize = 8 if spec.input_kind == "tokens" else torch.empty((), dtype=dtype).element_size()
    return math.prod(spec.sample_shape) * itemsize


def measure_step(
    model: nn.Sequential,
    spec: DatasetSpec,
    micro_batch: int,
    options: ProfileOptions,
) -> float:
    """Median seconds of one whole-model forward + loss + backward at `micro_batch` (the
    reference the sum of per-block costs is checked against)."""
    device = devices.resolve(options.device)
    with devices.pinned(device):
        return _measure_step(model, spec, micro_batch, options, device)


def _measure_step(
    model: nn.Sequential,
    spec: DatasetSpec,
    micro_batch: int,
    options: ProfileOptions,
    device: torch.device,
) -> float:
    dtype = devices.DTYPES[options.dtype]
    if not options.autocast:
        model = model.to(dtype)
    model = model.to(device)
    loss_fn = loss_for(spec)
    x, target = synthetic_batch(spec, micro_batch, seed=options.seed, dtype=dtype)
    x, target = x.to(device), target.to(device)

    def step() -> None:
        with precision(device, options):
            loss = loss_fn(model(x), target)
        torch.autograd.backward(loss)

    times = []
    for _ in range(options.warmup + options.repeats):
        model.zero_grad(set_to_none=True)
        times.append(devices.timed(device, step)[1])
    model.zero_grad(set_to_none=True)
    return robust(times[options.warmup :]).median
