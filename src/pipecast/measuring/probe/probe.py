"""The probe: measures the machine at hand and returns a Cluster.

One process per device. Every ordered pair of devices ping-pongs messages from 4 KiB to
256 MiB (fitted to latency + bytes / bandwidth); all-reduce is timed over the first n devices
for every n, giving bus bandwidth by group size; each device times a large matmul and reports
its memory; the host-side terms come from host_probe.py. On a CPU machine the same runs
over gloo between processes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from pipecast.measuring import hostspeed
from pipecast.measuring.probe import host_link, host_probe
from pipecast.runtime import devices
from pipecast.runtime.launch import Backend, Context, spawn
from pipecast.values.hardware.cluster import HOST_LINK, HOST_OPTIMIZER_RATE, Cluster, Link
from pipecast.values.hardware.fit import fit_link

KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class ProbeOptions:
    devices: int = 2
    """How many devices (processes) to probe."""
    device: str = "cpu"
    """'cuda' for one process per GPU over NCCL, 'cpu' for gloo processes."""
    min_bytes: int = 4 * KIB
    max_bytes: int = 256 * MIB
    repeats: int = 5
    matmul_size: int = 0
    """Square matmul side (0: 8192 on GPU, 1024 on CPU)."""
    runtime: bool = True
    """Also time the pipeline runtime's own host work per action."""


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    cluster: Cluster
    p2p: dict[str, list[list[float]]] = field(default_factory=dict)
    """'src-dst' -> [[bytes, seconds], ...] one-way times."""
    allreduce: dict[str, list[list[float]]] = field(default_factory=dict)
    """group size -> [[bytes, seconds], ...]."""
    allgather: dict[str, list[list[float]]] = field(default_factory=dict)
    """group size -> [[bytes gathered, seconds], ...]."""
    reduce_scatter: dict[str, list[list[float]]] = field(default_factory=dict)
    """group size -> [[bytes reduced, seconds], ...]."""
    matmul_flops: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "p2p": self.p2p,
            "allreduce": self.allreduce,
            "allgather": self.allgather,
            "reduce_scatter": self.reduce_scatter,
            "matmul_flops": self.matmul_flops,
        }


# torch 2.14 renamed the flat collectives FSDP runs (the old names warn that they are
# deprecated); torch 2.11 may have only the old ones
_ALL_GATHER: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER: Any = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _sizes(options: ProbeOptions) -> list[int]:
    sizes, s = [], options.min_bytes
    while s <= options.max_bytes:
        sizes.append(s)
        s *= 4
    return sizes


def _sync(ctx: Context) -> None:
    devices.synchronize(ctx.device)


def _pingpong(ctx: Context, a: int, b: int, nbytes: int, repeats: int) -> float:
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=ctx.device)
    times = []
    for rep in range(repeats + 1):
        _sync(ctx)
        began = time.perf_counter()
        if ctx.rank == a:
            dist.send(buf, b)
            dist.recv(buf, b)
        else:
            dist.recv(buf, a)
            dist.send(buf, a)
        _sync(ctx)
        if rep:
            times.append((time.perf_counter() - began) / 2)
    return statistics.median(times)


COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
"""The collectives the probe times by group size: DDP's all-reduce, and the all-gather and
reduce-scatter FSDP runs per unit (each measured, not assumed from the all-reduce)."""


def _collective(ctx: Context, kind: str, nbytes: int, n: int, group: Any, repeats: int) -> float:
    """Median seconds of one `kind` over the first `n` ranks, of `nbytes` in all (the
    all-gather's output, the reduce-scatter's input)."""
    whole = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
    share = torch.ones(max(nbytes // 4 // n, 1), dtype=torch.float32, device=ctx.device)
    whole = whole[: share.numel() * n] if kind != "allreduce" else whole

    def once() -> None:
        if kind == "allreduce":
            dist.all_reduce(whole, group=group)
        elif kind == "allgather":
            _ALL_GATHER(whole, share, group=group)
        else:
            _REDUCE_SCATTER(share, whole, group=group)

    once()  # warm-up
    times = []
    for _ in range(repeats):
        _sync(ctx)
        began = time.perf_counter()
        once()
        _sync(ctx)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _probe_rank(ctx: Context, options: ProbeOptions) -> dict[str, Any]:
    sizes = _sizes(options)
    p2p: dict[str, list[list[float]]] = {}
    for a in range(ctx.world):
        for b in range(ctx.world):
            if a == b:
                continue
            dist.barrier()
            if ctx.rank in (a, b):
                samples = [[s, _pingpong(ctx, a, b, s, options.repeats)] for s in sizes]
                if ctx.rank == a:
                    p2p[f"{a}-{b}"] = samples
    collectives: dict[str, dict[str, list[list[float]]]] = {k: {} for k in COLLECTIVES}
    for n in range(2, ctx.world + 1):
        group = dist.new_group(list(range(n)))
        dist.barrier()
        if ctx.rank < n:
            for kind in COLLECTIVES:
                samples = [[s, _collective(ctx, kind, s, n, group, options.repeats)] for s in sizes]
                if ctx.rank == 0:
                    collectives[kind][str(n)] = samples
    gpu = ctx.device.type == "cuda"
    side = options.matmul_size or (8192 if gpu else 1024)
    dtype = torch.bfloat16 if gpu else torch.float32
    x = torch.randn(side, side, device=ctx.device, dtype=dtype)
    y = torch.randn(side, side, device=ctx.device, dtype=dtype)
    torch.matmul(x, y)
    _, seconds = devices.timed(ctx.device, lambda: [torch.matmul(x, y) for _ in range(5)])
    flops = 5 * 2 * side**3 / seconds
    per_action, per_step = host_probe.runtime_overhead(ctx) if options.runtime else (0.0, 0.0)
    return {
        "p2p": p2p,
        **collectives,
        "matmul_flops": flops,
        "host_overhead": per_action,
        "step_overhead": per_step,
        "host_readings": host_probe.host_readings(ctx) if options.runtime else ({}, {}),
        "ddp": host_probe.ddp_overhead(ctx) if options.runtime and gpu else {},
        "memory": devices.total_memory(ctx.device),
        "name": devices.name(ctx.device),
        "host_optimizer_rate": host_link.optimizer_rate(min(64 * MIB, options.max_bytes)),
        "host_optimizer_rate_16": host_link.optimizer_rate(
            min(64 * MIB, options.max_bytes), dtype=torch.bfloat16
        ),
        "host_link": host_link.samples(
            ctx,
            min_bytes=min(MIB, options.max_bytes // 4),
            max_bytes=min(64 * MIB, options.max_bytes),
        ),
    }


def summarize_probe(per_rank: list[dict[str, Any]], name: str = "probed") -> ProbeResult:
    """Fit the raw samples of every rank into a Cluster (pure: tests feed it synthetic data)."""
    p2p: dict[str, list[list[float]]] = {}
    allreduce: dict[str, list[list[float]]] = {}
    gathers: dict[str, list[list[float]]] = {}
    scatters: dict[str, list[list[float]]] = {}
    for r in per_rank:
        p2p.update(r["p2p"])
        allreduce.update(r["allreduce"])
        gathers.update(r.get("allgather", {}))
        scatters.update(r.get("reduce_scatter", {}))
    pairs = {
        (int(k.split("-")[0]), int(k.split("-")[1])): fit_link([s for s, _ in v], [t for _, t in v])
        for k, v in p2p.items()
    }
    busbw, latency = _bus_bandwidths(allreduce, 2.0)
    gather_busbw, gather_latency = _bus_bandwidths(gathers, 1.0)
    scatter_busbw, scatter_latency = _bus_bandwidths(scatters, 1.0)
    if pairs:
        intra = Link(
            latency=statistics.median(link.latency for link in pairs.values()),
            bandwidth=statistics.median(link.bandwidth for link in pairs.values()),
        )
    else:
        intra = Link(latency=5e-6, bandwidth=1e10)
    world = len(per_rank)
    cpu = per_rank[0]["name"] == "cpu"  # CPU ranks share the host's memory: each its share
    host = host_link.fitted([r["host_link"] for r in per_rank if "host_link" in r])
    contention, issue = per_rank[0].get("host_readings", ({}, {}))
    ddp = per_rank[0].get("ddp", {})
    return ProbeResult(
        cluster=Cluster(
            name=name,
            device=per_rank[0]["name"],
            nodes=1,
            gpus_per_node=world,
            memory_bytes=min(r["memory"] for r in per_rank) // (world if cpu else 1),
            matmul_flops=min(r["matmul_flops"] for r in per_rank),
            intra=intra,
            inter=intra,
            allreduce_busbw=busbw,
            allreduce_latency=latency,
            allgather_busbw=gather_busbw,
            reduce_scatter_busbw=scatter_busbw,
            shard_latency=max(gather_latency, scatter_latency),
            pairs=pairs,
            host_overhead=statistics.median(r.get("host_overhead", 0.0) for r in per_rank),
            # a rank whose loop ends early waits for the others inside its step: the
            # rank with the least time around its loop is the one that set the step
            step_overhead=min(r.get("step_overhead", 0.0) for r in per_rank),
            host_contention={int(n): max(f, 1.0) for n, f in contention.items()},
            host_issue={int(n): seconds for n, seconds in issue.items()},
            machine=hostspeed.machine(),
            ddp_step_host=ddp.get("step", 0.0),
            ddp_param_host=ddp.get("param", 0.0),
            ddp_buffer_host=ddp.get("buffer", 0.0),
            host_link=host or HOST_LINK,
            host_optimizer_rate=min(
                (r["host_optimizer_rate"] for r in per_rank if "host_optimizer_rate" in r),
                default=HOST_OPTIMIZER_RATE,
            ),
            host_optimizer_rate_16=min(
                (r["host_optimizer_rate_16"] for r in per_rank if "host_optimizer_rate_16" in r),
                default=HOST_OPTIMIZER_RATE,
            ),
        ),
        p2p=p2p,
        allreduce=allreduce,
        allgather=gathers,
        reduce_scatter=scatters,
        matmul_flops=[r["matmul_flops"] for r in per_rank],
    )


def _bus_bandwidths(
    samples_by_size: dict[str, list[list[float]]], ring: float
) -> tuple[dict[int, float], float]:
    """Bus bandwidth by group size and the largest latency, fitted to `latency + ring (n-1)/n
    bytes / busbw` (ring 2 for an all-reduce, 1 for an all-gather or a reduce-scatter)."""
    busbw: dict[int, float] = {}
    latency = 0.0
    for n_text, samples in samples_by_size.items():
        n = int(n_text)
        factor = ring * (n - 1) / n
        link = fit_link([s * factor for s, _ in samples], [t for _, t in samples])
        busbw[n] = link.bandwidth
        latency = max(latency, link.latency)
    return busbw, latency


def probe(options: ProbeOptions) -> ProbeResult:
    """Measure this machine with `options.devices` processes."""
    backend: Backend = "nccl" if options.device.startswith("cuda") else "gloo"
    per_rank = spawn(_probe_rank, options.devices, (options,), backend=backend, timeout_s=600)
    return summarize_probe(per_rank, name=f"{options.devices}x {options.device}")
