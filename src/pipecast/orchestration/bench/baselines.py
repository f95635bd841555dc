"""The systems pipecast is measured against, in the same launch on the same GPUs: one
device (optionally with gradient accumulation), PyTorch DDP, and torch.distributed.pipelining
(GPipe, 1F1B, interleaved 1F1B, interleaved zero-bubble, ZB-V) on the same split."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipecast.errors import ConfigError
from pipecast.orchestration.bench.timing import barrier, gather_peaks, timed_steps
from pipecast.runtime import devices
from pipecast.runtime.launch import Context
from pipecast.runtime.stage import materialize
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models.workload import Workload

TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble",
}


def _dtype(dtype: str) -> torch.dtype:
    return devices.DTYPES[dtype]


def build(
    workload: Workload,
    device: torch.device,
    dtype: str,
    *,
    inplace: bool = True,
    blocks: slice | None = None,
) -> nn.Sequential:
    """Blocks of `workload` with fresh weights on `device` in `dtype` (built on the meta
    device first, so only the blocks asked for take memory)."""
    model = workload.build("meta")
    part = model[blocks] if blocks is not None else model
    assert isinstance(part, nn.Sequential)
    part = materialize(part, device).to(_dtype(dtype))
    if not inplace:  # torch.distributed.pipelining cannot take in-place ops at stage inputs
        for m in part.modules():
            if hasattr(m, "inplace"):
                setattr(m, "inplace", False)  # noqa: B010 - modules declare it as a plain bool
    assert isinstance(part, nn.Sequential)
    return part


def _batch(
    workload: Workload, batch: int, dtype: str, device: torch.device, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = synthetic_batch(workload.spec, batch, seed=seed, dtype=_dtype(dtype))
    return x.to(device), y.to(device)


def single_device(
    ctx: Context,
    workload: Workload,
    batch: int,
    *,
    microbatches: int = 1,
    dtype: str = "bf16",
    steps: int = 6,
    warmup: int = 2,
) -> dict[str, Any]:
    """Rank 0 trains on the whole batch (accumulating `microbatches`); others wait."""
    result: dict[str, Any] = {"step_time": 0.0, "peak_allocated": 0, "peak_reserved": 0}
    if ctx.rank == 0:
        model = build(workload, ctx.device, dtype)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        loss_fn = loss_for(workload.spec)
        x, y = _batch(workload, batch, dtype, ctx.device)
        xs, ys = torch.tensor_split(x, microbatches), torch.tensor_split(y, microbatches)

        def step() -> None:
            for xm, ym in zip(xs, ys, strict=True):
                torch.autograd.backward(loss_fn(model(xm), ym) / microbatches)
            opt.step()
            opt.zero_grad(set_to_none=True)

        result = timed_steps(step, ctx.device, steps=steps, warmup=warmup)
    else:
        for _ in range(steps + warmup):  # keep step with rank 0's barriers
            barrier(ctx.device)
            barrier(ctx.device)
    return gather_peaks(result, ctx.device)


def ddp(
    ctx: Context,
    workload: Workload,
    batch: int,
    *,
    dtype: str = "bf16",
    steps: int = 6,
    warmup: int = 2,
) -> dict[str, Any]:
    """PyTorch DistributedDataParallel: each rank trains on batch / world samples."""
    from torch.nn.parallel import DistributedDataParallel

    if batch % ctx.world:
        raise ConfigError(f"batch {batch} does not split over {ctx.world} ranks")
    torch.manual_seed(0)
    model = build(workload, ctx.device, dtype)
    wrapped = DistributedDataParallel(
        model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None
    )
    opt = torch.optim.SGD(wrapped.parameters(), lr=1e-4)
    loss_fn = loss_for(workload.spec)
    x, y = _batch(workload, batch, dtype, ctx.device)
    share = batch // ctx.world
    # copies, so the rest of the batch is freed: a rank holds its own share, as the
    # simulator counts it (a view would hold the whole batch on every rank)
    x, y = (
        x[ctx.rank * share : (ctx.rank + 1) * share].clone(),
        y[ctx.rank * share : (ctx.rank + 1) * share].clone(),
    )

    def step() -> None:
        torch.autograd.backward(loss_fn(wrapped(x), y))
        opt.step()
        opt.zero_grad(set_to_none=True)

    result = timed_steps(step, ctx.device, steps=steps, warmup=warmup)
    return gather_peaks(result, ctx.device)


def torch_pipelining(
    ctx: Context,
    workload: Workload,
    batch: int,
    boundaries: list[int],
    *,
    schedule: str,
    microbatches: int,
    dtype: str = "bf16",
    steps: int = 6,
    warmup: int = 2,
) -> dict[str, Any]:
    """torch.distributed.pipelining with the given split (len(boundaries) - 1 stages)."""
    import torch.distributed.pipelining as tp

    stages_total = len(boundaries) - 1
    world = ctx.world
    blocks = len(workload.build("meta"))
    if boundaries[0] != 0 or boundaries[-1] != blocks:
        raise ConfigError(f"split {boundaries} must run from block 0 to the model's {blocks}")
    if schedule in ("interleaved", "interleaved-zb"):
        own = [ctx.rank + k * world for k in range(stages_total // world)]
    elif schedule == "zb-v":
        own = [ctx.rank, 2 * world - 1 - ctx.rank]
    else:
        own = [ctx.rank]
    if stages_total != len(own) * world:
        raise ConfigError(
            f"{schedule} on {world} ranks needs {len(own) * world} stages, the "
            f"split has {stages_total}"
        )
    torch.manual_seed(0)
    modules = {
        s: build(
            workload,
            ctx.device,
            dtype,
            inplace=False,
            blocks=slice(boundaries[s], boundaries[s + 1]),
        )
        for s in own
    }
    stages = [tp.PipelineStage(modules[s], s, stages_total, ctx.device) for s in own]
    loss_fn = loss_for(workload.spec)
    cls = getattr(tp, TORCH_SCHEDULES[schedule])
    runner = cls(
        stages if len(stages) > 1 else stages[0], n_microbatches=microbatches, loss_fn=loss_fn
    )
    params = [p for m in modules.values() for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=1e-4)
    x, y = _batch(workload, batch, dtype, ctx.device)
    first, last = 0 in own, stages_total - 1 in own

    def step() -> None:
        kwargs: dict[str, Any] = {"target": y, "losses": []} if last else {}
        runner.step(*((x,) if first else ()), **kwargs)
        opt.step()
        opt.zero_grad(set_to_none=True)

    result = timed_steps(step, ctx.device, steps=steps, warmup=warmup)
    if dist.is_initialized():
        dist.barrier()
    return gather_peaks(result, ctx.device)
