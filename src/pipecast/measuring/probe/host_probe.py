"""The probe's host-side measurements, taken in the ranks: the pipeline runtime's own host
work per action and per step, how fast a rank's host issues work alone and with n ranks
busy, what torch's DistributedDataParallel adds to a step's host work, and how much
slower CPU ranks compute sharing the machine's cores."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn

from pipecast.measuring import hostspeed
from pipecast.runtime import devices
from pipecast.runtime.launch import Context, all_gather_floats
from pipecast.values.hardware.cluster import DDP_PARAM_HOST

if TYPE_CHECKING:
    from pipecast.measuring.profiler.profiler import ProfileOptions
    from pipecast.runtime.worker import StepRecord
    from pipecast.values.models.workload import Workload
    from pipecast.values.profile.types import Dtype


def runtime_overhead(ctx: Context, microbatches: int = 32) -> tuple[float, float]:
    """Host seconds the pipeline runtime spends per action beyond the ops it issues, and per
    step around its actions: a 1F1B pipeline over every rank with one tiny Linear per
    stage. Per action: its action loop's host time per action less what the Linear's own
    forward and backward take to issue. Per step: the step's time (between the barriers
    that part steps) less its action loop, where the tiny work leaves the device idle.
    On CPU ranks too: there the runtime's own work takes the cores the model computes on
    (the simulator adds it to each action's compute). Zeros for a single rank."""
    from pipecast.planning.schedules.generators import make_plan
    from pipecast.runtime.config import RunConfig
    from pipecast.runtime.job import TrainJob
    from pipecast.runtime.worker import run_rank
    from pipecast.values.partition import from_boundaries

    if ctx.world < 2:
        return 0.0, 0.0
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
        device="cuda" if ctx.device.type == "cuda" else "cpu",
        steps=5,
        warmup_steps=2,
    )
    report = run_rank(ctx, job)
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
    return runtime_terms(report.steps, 2 * microbatches, statistics.median(issue))


def runtime_terms(steps: Sequence[StepRecord], actions: int, issue: float) -> tuple[float, float]:
    """Per action and per step, from the probe's steps of `actions` actions each whose own
    ops take `issue` host seconds per action: the loop's host time per action beyond its
    ops, and the step's time beyond its loop (medians over the steps, never below 0)."""
    per_action = statistics.median(s.host_loop for s in steps) / actions - issue
    per_step = statistics.median(s.seconds - s.host_loop for s in steps)
    return max(per_action, 0.0), max(per_step, 0.0)


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
    readings compare), and (n -> hostspeed.issue() seconds, 1: alone), medians over rounds."""
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
"""Buffer-holding layers in the model ddp_overhead times."""


def ddp_overhead(ctx: Context, repeats: int = 9) -> dict[str, float]:
    """Host seconds torch's DistributedDataParallel adds to a step: whatever the model (a
    single Linear) and per buffer tensor (64 BatchNorms without affine parameters, 3
    buffers each), each the DDP-wrapped model's host time less the plain model's, timed on
    every rank at once; per parameter tensor, DDP_PARAM_HOST. The probe reads it on GPUs
    only: on CPU ranks gloo's all-reduce holds the host, and the simulator models the
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
        plain = hostspeed.step_seconds(model, x, ctx.device, repeats=repeats, warmup=2)
        # once wrapped, DDP's hooks fire on the model's own gradients too: plain goes first.
        # Two warm-ups: DDP builds its buckets in the first step.
        wrapped = DistributedDataParallel(model, device_ids=ids)
        ddp = hostspeed.step_seconds(wrapped, x, ctx.device, repeats=repeats, warmup=2)
        return ddp - plain

    step = added([nn.Linear(width, width)])
    buffers = added(
        [*(nn.BatchNorm1d(width, affine=False) for _ in range(n)), nn.Linear(width, width)]
    )
    rows = all_gather_floats([max(step, 0.0), max(buffers - step, 0.0) / (3 * n)], ctx.device)
    read = {
        key: statistics.median(row[i] for row in rows) for i, key in enumerate(("step", "buffer"))
    }
    return read | {"param": DDP_PARAM_HOST}


MATMUL_SECONDS = (0.05, 0.3)
"""_matmuls: warm up for the first, then time for the second. A fixed count of short
matmuls falls within a freshly spawned rank's slow first milliseconds, and read one rank
alone several times as slow as this process, which would have priced every single-rank
CPU strategy as much too slow (docs/decisions.md, "CPU ranks share their cores"); ranks
that time for a fixed while also overlap for all of it, where a fixed count lets the
faster finish first."""


def _matmuls(side: int = 384) -> float:
    """Median seconds of a fixed CPU matmul with this process's threads, over MATMUL_SECONDS."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(side, side, generator=generator)
    y = torch.randn(side, side, generator=generator)
    warmup, timed = MATMUL_SECONDS
    began = time.perf_counter()
    while time.perf_counter() - began < warmup:
        torch.matmul(x, y)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < timed:
        began = time.perf_counter()
        torch.matmul(x, y)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _at_once(ctx: Context, measure: Callable[[], float]) -> float:
    """`measure()` on this rank, begun with every other rank's."""
    all_gather_floats([0.0], ctx.device)  # start together
    return measure()


def _compute_rank(ctx: Context) -> float:
    return _at_once(ctx, _matmuls)


def _over_alone(times: Sequence[float], alone: float) -> float:
    """The ranks' median time over the time alone (at least 1: sharing never speeds up)."""
    return max(statistics.median(times) / alone, 1.0) if alone > 0 else 1.0


def cpu_compute(counts: Sequence[int]) -> dict[int, float]:
    """For CPU ranks: n -> the median over n ranks computing at once (each with the
    runtime's threads, cores // n) of a fixed matmul's time, over its time in this process
    with torch's own threads (as the profiler computes)."""
    from pipecast.runtime.launch import spawn

    alone = _matmuls()
    return {
        n: _over_alone(spawn(_compute_rank, n, backend="gloo", timeout_s=120), alone)
        for n in counts
    }


SHARED_REPEATS = 3
"""shared_compute: timed steps after one warm-up, alone and at least as many in each rank
(the median is kept)."""
BUSY_SECONDS = 0.5
"""shared_compute: each rank steps for at least about this long: steps of a few
milliseconds would otherwise finish within the scheduler's time slices, one rank after
another, and never share the cores."""


def _step_options(dtype: Dtype, repeats: int = SHARED_REPEATS) -> ProfileOptions:
    from pipecast.measuring.profiler.profiler import ProfileOptions

    return ProfileOptions(device="cpu", dtype=dtype, warmup=1, repeats=repeats)


def _model_rank(
    ctx: Context, workload: Workload, micro_batch: int, dtype: Dtype, repeats: int
) -> float:
    from pipecast.measuring.profiler.profiler import measure_step

    model = workload.build()  # before the ranks start together
    options = _step_options(dtype, repeats)
    return _at_once(ctx, partial(measure_step, model, workload.spec, micro_batch, options))


def shared_compute(
    workload: Workload,
    counts: Iterable[int],
    batch: int,
    *,
    dtype: Dtype = "fp32",
    progress: Callable[[str], None] | None = None,
) -> dict[int, float]:
    """For CPU ranks, with the model itself (the fixed matmul of cpu_compute is a poor
    stand-in: n ranks at once slow it by other factors than they slow a model, whose
    convolutions use two threads better; docs/decisions.md, "CPU ranks share their cores"): n -> the
    median over n gloo ranks, all computing at once (each with the runtime's threads), of
    the model's forward and backward at batch // n samples, over the same step in this
    process alone (at least 1). Counts below 2 are left out: one rank has the profiler's
    threads. Profile.shared_compute holds the result."""
    from pipecast.measuring.profiler.profiler import measure_step
    from pipecast.runtime.launch import spawn

    out: dict[int, float] = {}
    for n in sorted({n for n in counts if n >= 2}):
        if progress is not None:
            progress(f"{n} ranks sharing the cores")
        micro_batch = max(1, batch // n)
        alone = measure_step(workload.build(), workload.spec, micro_batch, _step_options(dtype))
        repeats = max(SHARED_REPEATS, min(200, math.ceil(BUSY_SECONDS / max(alone, 1e-6))))
        together = spawn(_model_rank, n, (workload, micro_batch, dtype, repeats), backend="gloo")
        out[n] = _over_alone(together, alone)
    return out
