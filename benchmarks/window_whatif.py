"""Which statistic over the profile's host windows carries: each size's host costs are the
median over three windows of whole-model passes spread through the profile
(profile/context.py, across_windows). Re-predicts every stored run whose profiles kept each
window's whole-model host seconds (`Profile.window_host`) with every block's host costs at
each size scaled by that size's statistic over the median: `median` (what the profiler
keeps), `mean`, `max` (the slowest window) and `min` (the fastest). CPU only, about a minute.

Written after h100x4-run21, whose VGG-16/CIFAR-10 profile read windows of 4.4, 5.9 and 4.5 ms
at 128 samples (median 4.5) where runs 18-20 read medians of 5.4-6.3 ms, and whose rows of
that model all came out fast; chosen with that run in view, so it decides nothing by itself.

    cd benchmarks && python3 window_whatif.py > results/window-whatif.txt
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted, run_profiles
from error_bands import RUNS

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.pool import HOST_COSTS, with_host_costs
from pipecast.profile.types import Profile

RESULTS = Path(__file__).parent / "results"
STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "median": statistics.median,
    "mean": statistics.fmean,
    "max": max,
    "min": min,
}


def scaled(p: Profile, stat: Callable[[Sequence[float]], float]) -> Profile:
    """`p` with each size's host costs scaled by stat(windows) / median(windows)."""
    factor = {
        mb: stat(w) / statistics.median(w)
        for mb, w in p.window_host.items()
        if len(w) > 1 and statistics.median(w) > 0
    }
    if not factor:
        return p
    return with_host_costs(
        p,
        lambda _, mb, c: (
            {f: getattr(c, f) * factor[mb] for f in HOST_COSTS} if mb in factor else None
        ),
    )


def main() -> None:
    within = dict.fromkeys(STATISTICS, 0)
    rows = 0
    for run in RUNS:
        path = RESULTS / run
        base = run_profiles(path)
        if not any(len(w) > 1 for p in base.values() for w in p.window_host.values()):
            continue
        line = [f"{run:20s}"]
        for name, stat in STATISTICS.items():
            s = summary(
                comparisons(repredicted(path, {k: scaled(p, stat) for k, p in base.items()}))
            )
            within[name] += s["within_20_percent"]
            line.append(
                f"{name:6s} {s['median_abs_error']:6.1%} {s['worst_abs_error']:6.1%} "
                f"{s['within_20_percent']:2d} {s['right']}/{s['decisions']}"
            )
        rows += s["configurations"]
        print(" | ".join(line), flush=True)
    for name, n in within.items():
        print(f"{name}: {n} of {rows} within 20%")


if __name__ == "__main__":
    main()
