"""The probe: measures the machine at hand and returns a Cluster.

One process per device. Every ordered pair of devices ping-pongs messages from 4 KiB to
256 MiB (fitted to latency + bytes / bandwidth); all-reduce is timed over the first n devices
for every n, giving bus bandwidth by group size; each device times a large matmul and reports
its memory. On a CPU machine the same runs over gloo between processes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipecast import devices, hostspeed
from pipecast.hardware.cluster import Cluster, Link
from pipecast.hardware.fit import fit_link
from pipecast.runtime.launch import Backend, Context, all_gather_floats, spawn

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
    matmul_flops: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"p2p": self.p2p, "allreduce": self.allreduce, "matmul_flops": self.matmul_flops}


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
    allreduce: dict[str, list[list[float]]] = {}
    for n in range(2, ctx.world + 1):
        group = dist.new_group(list(range(n)))
        dist.barrier()
        if ctx.rank < n:
            samples = []
            for s in sizes:
                buf = torch.ones(s // 4, dtype=torch.float32, device=ctx.device)
                dist.all_reduce(buf, group=group)  # warm-up
                times = []
                for _ in range(options.repeats):
                    _sync(ctx)
                    began = time.perf_counter()
                    dist.all_reduce(buf, group=group)
                    _sync(ctx)
                    times.append(time.perf_counter() - began)
                samples.append([s, statistics.median(times)])
            if ctx.rank == 0:
                allreduce[str(n)] = samples
    side = options.matmul_size or (8192 if ctx.device.type == "cuda" else 1024)
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    x = torch.randn(side, side, device=ctx.device, dtype=dtype)
    y = torch.randn(side, side, device=ctx.device, dtype=dtype)
    torch.matmul(x, y)
    _, seconds = devices.timed(ctx.device, lambda: [torch.matmul(x, y) for _ in range(5)])
    flops = 5 * 2 * side**3 / seconds
    return {
        "p2p": p2p,
        "allreduce": allreduce,
        "matmul_flops": flops,
        "host_overhead": runtime_overhead(ctx) if options.runtime else 0.0,
        "host_readings": host_readings(ctx) if options.runtime else ({}, {}),
        "ddp": ddp_overhead(ctx) if options.runtime and ctx.device.type == "cuda" else {},
        "memory": devices.total_memory(ctx.device),
        "name": devices.name(ctx.device),
    }


def runtime_overhead(ctx: Context, microbatches: int = 32) -> float:
    """Host seconds the pipeline runtime spends per action beyond the ops it issues: a
    1F1B pipeline over every rank with one tiny Linear per stage, its action loop's host
    time per action less what the Linear's own forward and backward take to issue. Zero on
    CPU ranks (there the host's work is the device's, and the profile holds it)."""
    from pipecast.partition.types import from_boundaries
    from pipecast.runtime.config import RunConfig
    from pipecast.runtime.job import TrainJob
    from pipecast.runtime.worker import run_rank
    from pipecast.schedule.generators import make_plan

    if ctx.device.type != "cuda" or ctx.world < 2:
        return 0.0
    width = 16
    blocks: list[nn.Module] = [nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, width))]
    blocks += [nn.Linear(width, width) for _ in range(ctx.world - 2)] + [nn.Linear(width, 10)]
    job = TrainJob(
        plan=make_plan("1f1b", ctx.world, microbatches),
        partition=from_boundaries(list(range(ctx.world + 1))),
        batch=microbatches,
        model=nn.Sequential(*blocks),
        dataset="mnist",
        config=RunConfig(dtype="fp32", record_events=False, timeout_s=120),
        device="cuda",
        steps=5,
        warmup_steps=2,
    )
    report = run_rank(ctx, job)
    per_action = statistics.median(s.host_loop for s in report.steps) / (2 * microbatches)
    layer = nn.Linear(width, width).to(ctx.device)
    x = torch.randn(1, width, device=ctx.device, requires_grad=True)
    issue = []
    for _ in range(20):
        out, _, forward = devices.timed_with_host(ctx.device, lambda: layer(x))
        grad = torch.ones_like(out)
        _, _, backward = devices.timed_with_host(
            ctx.device, partial(torch.autograd.backward, out, grad)
        )
        issue.append((forward + backward) / 2)
    return max(per_action - statistics.median(issue), 0.0)


ROUNDS = 4
"""Rounds of readings alone and together, interleaved: a host's speed moves in spells of
seconds (hostspeed.py), so one reading of each would compare two spells, not two loads."""
IDLE_S = 0.2
"""How long ranks that do not read sleep through a reading (about 3 x 10 ms)."""


def _reading(ctx: Context, reads: bool) -> list[tuple[float, float]]:
    """hostspeed readings (the loop's, then issue's) taken at once by the ranks that
    `reads`; the others sleep through them rather than wait in a collective, which can spin
    a core. Every rank's pair ((0, 0): did not read)."""
    all_gather_floats([0.0], ctx.device)  # start together
    if reads:
        values = [hostspeed.reference(repeats=3), hostspeed.issue(ctx.device)]
    else:
        time.sleep(IDLE_S)
        values = [0.0, 0.0]
    return [(row[0], row[1]) for row in all_gather_floats(values, ctx.device)]


def host_readings(ctx: Context) -> tuple[dict[str, float], dict[str, float]]:
    """How fast a rank's host runs alone and while n ranks run at once: cores share clocks,
    caches and memory bandwidth, and SMT siblings a core; the profile was taken alone, in
    another process. Each round reads every rank alone in turn, then the first n together
    for every n. Returns (n -> contention, the loop's together/alone ratio, as the bench's
    readings compare: over two 2 x H200 runs its 2-rank readings were 1.19x and 1.28x its
    1-rank ones), and (n -> hostspeed.issue() seconds, 1: alone), medians over rounds."""
    alone: list[tuple[float, float]] = []
    together: dict[int, list[tuple[float, float]]] = {n: [] for n in range(2, ctx.world + 1)}
    for _ in range(ROUNDS):
        for r in range(ctx.world):
            alone.append(_reading(ctx, ctx.rank == r)[r])
        for n in together:
            rows = _reading(ctx, ctx.rank < n)[:n]
            together[n].append(
                (
                    statistics.median(loop for loop, _ in rows),
                    statistics.median(issued for _, issued in rows),
                )
            )
    base = statistics.median(loop for loop, _ in alone)
    contention = {
        str(n): statistics.median(loop for loop, _ in rows) / base for n, rows in together.items()
    }
    issue = {"1": statistics.median(issued for _, issued in alone)}
    issue |= {
        str(n): statistics.median(issued for _, issued in rows) for n, rows in together.items()
    }
    return contention, issue


DDP_TENSORS = 64
"""Parameter tensors (and buffer-holding layers) in the models ddp_overhead times."""


def _step_host(model: nn.Module, x: torch.Tensor, device: torch.device, repeats: int) -> float:
    """Median host seconds to issue one forward and backward of `model`, the device idle at
    the start of each."""
    times = []
    for _ in range(repeats + 2):  # two warm-ups: DDP builds its buckets in the first
        devices.synchronize(device)
        began = time.perf_counter()
        model(x).sum().backward()
        times.append(time.perf_counter() - began)
    devices.synchronize(device)
    return statistics.median(times[2:])


def ddp_overhead(ctx: Context, repeats: int = 9) -> dict[str, float]:
    """Host seconds torch's DistributedDataParallel adds to a step: whatever the model (a
    single Linear), per parameter tensor (64 bias-free Linears) and per buffer tensor (64
    BatchNorms without affine parameters, 3 buffers each). Each is the DDP-wrapped model's
    host time less the plain model's, timed on every rank at once. The probe reads it on
    GPUs only: on CPU ranks gloo's all-reduce holds the host, and the simulator models the
    all-reduce itself."""
    from torch.nn.parallel import DistributedDataParallel

    if ctx.world < 2:
        return {}
    width, n = 8, DDP_TENSORS
    x = torch.randn(4, width, device=ctx.device)
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None

    def added(layers: list[nn.Module]) -> float:
        torch.manual_seed(0)
        model = nn.Sequential(*layers).to(ctx.device)
        plain = _step_host(model, x, ctx.device, repeats)
        # once wrapped, DDP's hooks fire on the model's own gradients too: plain goes first
        ddp = _step_host(DistributedDataParallel(model, device_ids=ids), x, ctx.device, repeats)
        return ddp - plain

    step = added([nn.Linear(width, width)])
    params = added([nn.Linear(width, width, bias=False) for _ in range(n)])
    buffers = added(
        [*(nn.BatchNorm1d(width, affine=False) for _ in range(n)), nn.Linear(width, width)]
    )
    per_param = max(params - step, 0.0) / (n - 2)  # the single Linear held two tensors
    rows = all_gather_floats(
        [max(step, 0.0), per_param, max(buffers - step, 0.0) / (3 * n)], ctx.device
    )
    return {
        key: statistics.median(row[i] for row in rows)
        for i, key in enumerate(("step", "param", "buffer"))
    }


def summarize_probe(per_rank: list[dict[str, Any]], name: str = "probed") -> ProbeResult:
    """Fit the raw samples of every rank into a Cluster (pure: tests feed it synthetic data)."""
    p2p: dict[str, list[list[float]]] = {}
    allreduce: dict[str, list[list[float]]] = {}
    for r in per_rank:
        p2p.update(r["p2p"])
        allreduce.update(r["allreduce"])
    pairs = {
        (int(k.split("-")[0]), int(k.split("-")[1])): fit_link([s for s, _ in v], [t for _, t in v])
        for k, v in p2p.items()
    }
    busbw: dict[int, float] = {}
    latency = 0.0
    for n_text, samples in allreduce.items():
        n = int(n_text)
        factor = 2 * (n - 1) / n
        link = fit_link([s * factor for s, _ in samples], [t for _, t in samples])
        busbw[n] = link.bandwidth
        latency = max(latency, link.latency)
    if pairs:
        intra = Link(
            latency=statistics.median(link.latency for link in pairs.values()),
            bandwidth=statistics.median(link.bandwidth for link in pairs.values()),
        )
    else:
        intra = Link(latency=5e-6, bandwidth=1e10)
    world = len(per_rank)
    contention, issue = per_rank[0].get("host_readings", ({}, {}))
    ddp = per_rank[0].get("ddp", {})
    return ProbeResult(
        cluster=Cluster(
            name=name,
            device=per_rank[0]["name"],
            nodes=1,
            gpus_per_node=world,
            memory_bytes=min(r["memory"] for r in per_rank),
            matmul_flops=min(r["matmul_flops"] for r in per_rank),
            intra=intra,
            inter=intra,
            allreduce_busbw=busbw,
            allreduce_latency=latency,
            pairs=pairs,
            host_overhead=statistics.median(r.get("host_overhead", 0.0) for r in per_rank),
            host_contention={int(n): max(f, 1.0) for n, f in contention.items()},
            host_issue={int(n): seconds for n, seconds in issue.items()},
            ddp_step_host=ddp.get("step", 0.0),
            ddp_param_host=ddp.get("param", 0.0),
            ddp_buffer_host=ddp.get("buffer", 0.0),
        ),
        p2p=p2p,
        allreduce=allreduce,
        matmul_flops=[r["matmul_flops"] for r in per_rank],
    )


def probe(options: ProbeOptions) -> ProbeResult:
    """Measure this machine with `options.devices` processes."""
    backend: Backend = "nccl" if options.device.startswith("cuda") else "gloo"
    per_rank = spawn(_probe_rank, options.devices, (options,), backend=backend, timeout_s=600)
    return summarize_probe(per_rank, name=f"{options.devices}x {options.device}")
