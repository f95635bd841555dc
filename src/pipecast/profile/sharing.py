"""CPU ranks share the cores the profiler had to itself: how much slower the model itself
computes in n ranks at once than in one process.

The profiler times a CPU model in one process with torch's threads over every core. The
runtime gives each of n ranks cores // n threads (at least one), and n ranks on fewer cores
than n take turns. How much that costs depends on the model: on a 2-core machine a fixed
384 x 384 matmul read 2.13x and 2.59x for 2 and 4 ranks, ResNet-18 on CIFAR-10 shapes 1.85x
and 3.84x (its convolutions use two threads better than the small matmul does). So the
model's own forward and backward are timed, alone and in n ranks at once."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable

from pipecast.models.workload import Workload
from pipecast.profile.profiler import ProfileOptions, measure_step
from pipecast.profile.types import Dtype

REPEATS = 3
"""Timed steps after one warm-up, alone and at least as many in each rank (the median is
kept)."""
BUSY_SECONDS = 0.5
"""Each rank steps for at least about this long: steps of a few milliseconds would
otherwise finish within the scheduler's time slices, one rank after another, and never
share the cores."""


def _options(dtype: Dtype, repeats: int = REPEATS) -> ProfileOptions:
    return ProfileOptions(device="cpu", dtype=dtype, warmup=1, repeats=repeats)


def _rank_step(
    ctx: object, workload: Workload, micro_batch: int, dtype: Dtype, repeats: int
) -> float:
    import torch.distributed as dist

    model = workload.build()
    if dist.is_initialized():
        dist.barrier()  # every rank computes at once
    return measure_step(model, workload.spec, micro_batch, _options(dtype, repeats))


def shared_compute(
    workload: Workload,
    counts: Iterable[int],
    batch: int,
    *,
    dtype: Dtype = "fp32",
    progress: Callable[[str], None] | None = None,
) -> dict[int, float]:
    """n -> the median over n gloo ranks, all computing at once (each with the runtime's
    threads), of the model's forward and backward at batch // n samples, over the same
    step in this process alone (at least 1). Counts below 2 are left out: one rank has the
    profiler's threads."""
    from pipecast.runtime.launch import spawn

    out: dict[int, float] = {}
    for n in sorted({n for n in counts if n >= 2}):
        if progress is not None:
            progress(f"{n} ranks sharing the cores")
        micro_batch = max(1, batch // n)
        alone = measure_step(workload.build(), workload.spec, micro_batch, _options(dtype))
        repeats = max(REPEATS, min(200, math.ceil(BUSY_SECONDS / max(alone, 1e-6))))
        together = spawn(_rank_step, n, (workload, micro_batch, dtype, repeats), backend="gloo")
        out[n] = max(statistics.median(together) / alone, 1.0) if alone > 0 else 1.0
    return out
