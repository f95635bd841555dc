"""Copies between a device and pinned host memory, timed as offloaded activations move:
on a stream of their own while the device computes, every rank of the node at once (they
share the host's memory and its links). The slower direction sets Cluster.host_link."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from pipecast.runtime import devices
from pipecast.runtime.launch import Context
from pipecast.values.hardware.cluster import Link
from pipecast.values.hardware.fit import fit_link

MIB = 2**20


def _seconds(ctx: Context, copy: Callable[[], object], repeats: int) -> float:
    """Median seconds of `copy`, on a side stream behind a busy default stream (GPU)."""
    times = []
    for _ in range(repeats + 1):
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        if ctx.device.type != "cuda":
            began = time.perf_counter()
            copy()
            times.append(time.perf_counter() - began)
            continue
        side = torch.cuda.Stream(ctx.device)  # type: ignore[no-untyped-call]
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        devices.hold(ctx.device, 0.02)  # the compute the copies run beside
        with torch.cuda.stream(side):
            start.record()
            copy()
            end.record()
        torch.cuda.synchronize(ctx.device)
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times[1:])


def _copier(dst: torch.Tensor, src: torch.Tensor) -> Callable[[], object]:
    return lambda: dst.copy_(src, non_blocking=True)


def samples(
    ctx: Context, *, min_bytes: int = MIB, max_bytes: int = 64 * MIB, repeats: int = 3
) -> dict[str, list[list[float]]]:
    """'to_host' and 'from_host' -> [[bytes, seconds], ...] for this rank."""
    pinned = ctx.device.type == "cuda"
    out: dict[str, list[list[float]]] = {"to_host": [], "from_host": []}
    size = min_bytes
    while size <= max_bytes:
        dev = torch.empty(size, dtype=torch.uint8, device=ctx.device)
        host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        out["to_host"].append([size, _seconds(ctx, _copier(host, dev), repeats)])
        out["from_host"].append([size, _seconds(ctx, _copier(dev, host), repeats)])
        size *= 4
    return out


def fitted(per_rank: list[dict[str, list[list[float]]]]) -> Link | None:
    """The slowest rank's slower direction, fitted (None: nothing measured)."""
    links = [
        fit_link([s for s, _ in rows], [t for _, t in rows])
        for r in per_rank
        for rows in r.values()
        if len({s for s, _ in rows}) > 1
    ]
    return min(links, key=lambda link: link.bandwidth) if links else None


def optimizer_rate(
    nbytes: int = 64 * MIB, repeats: int = 3, dtype: torch.dtype = torch.float32
) -> float:
    """Bytes of weights in `dtype` per second one Adam step covers on this host, fused as
    the runtime's offloaded optimizer is (runtime.stage.make_optimizer), every rank at once
    as offloaded optimizers step together: Cluster.host_optimizer_rate (fp32) and
    host_optimizer_rate_16 (bf16). Per byte the two differ: a 16-bit weight is widened to
    fp32 for the arithmetic and its state narrowed back."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    weight = torch.nn.Parameter(torch.zeros(nbytes // itemsize, dtype=dtype))
    weight.grad = torch.full_like(weight, 1e-3)
    adam = torch.optim.Adam([weight], lr=1e-3, fused=True)
    adam.step()  # its state, allocated once
    times = []
    for _ in range(repeats):
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        began = time.perf_counter()
        adam.step()
        times.append(time.perf_counter() - began)
    return nbytes / statistics.median(times)
