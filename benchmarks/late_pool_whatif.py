"""Would reading a model's host costs twice on one machine, minutes apart, and pooling them
predict better than one reading? The runs that profiled every model again at its smallest
size after their suite (`gpu_run.py --late-profiles`: RUNS) are re-predicted with the
smallest size's host costs (the ones the predictor uses: profile/types.py, _interp_cost)
taken from the profile before the suite (`early`, as every stored run is predicted), the
one after it (`late`), or their mean (`mean`); everything else as the run's own profile
and probe. CPU only, a few seconds.

Written after h100x4-run21, for the question `pooled_check.py` raises about one run's host
reading: across runs of one machine kind, host costs pooled over other runs predicted
better than a run's own; this asks whether a second reading on the same machine does.

    cd benchmarks && python3 late_pool_whatif.py > results/late-pool-whatif.txt
"""

from __future__ import annotations

import statistics
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted, run_profiles
from error_bands import RUNS as ALL_RUNS

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.pool import HOST_COSTS, with_host_costs
from pipecast.profile.types import BlockCost, Profile

RESULTS = Path(__file__).parent / "results"
RUNS = tuple(run for run in ALL_RUNS if any((RESULTS / run).glob("late_profile_*.json")))
"""Every stored run with late profiles, in error_bands.RUNS's order (up to h200x2-run4:
h100x4-run5, -run13, -run14, h200x4-run13 and h200x2-run4; a new run joins as it is
stored)."""


def with_host(early: Profile, late: Profile, weight: float) -> Profile:
    """`early` with its smallest size's host costs (1 - weight) x early + weight x late."""
    size = min(early.micro_batches)

    def mixed(i: int, mb: int, e: BlockCost) -> dict[str, float] | None:
        if mb != size:
            return None
        lc = late.blocks[i].costs[size]
        return {f: (1 - weight) * getattr(e, f) + weight * getattr(lc, f) for f in HOST_COSTS}

    return with_host_costs(early, mixed)


def main() -> None:
    variants = {"early": 0.0, "late": 1.0, "mean": 0.5}
    within = dict.fromkeys(variants, 0)
    medians: dict[str, list[float]] = {v: [] for v in variants}
    rows = 0
    for run in RUNS:
        path = RESULTS / run
        early = run_profiles(path)
        late = run_profiles(path, "late_profile_")
        cells = []
        for name, weight in variants.items():
            chosen = {
                k: with_host(p, late[k], weight) if k in late else p for k, p in early.items()
            }
            s = summary(comparisons(repredicted(path, chosen)))
            within[name] += s["within_20_percent"]
            medians[name].append(s["host_bound_median_abs_error"])
            cells.append(
                f"{name:5s} {s['median_abs_error']:6.1%} {s['worst_abs_error']:6.1%} "
                f"{s['within_20_percent']:2d} host-bound {s['host_bound_median_abs_error']:6.1%}"
            )
        rows += s["configurations"]
        print(f"{run:14s} " + " | ".join(cells), flush=True)
    for name in variants:
        print(
            f"{name}: {within[name]} of {rows} within 20%, host-bound median of the run "
            f"medians {statistics.median(medians[name]):.1%}"
        )


if __name__ == "__main__":
    main()
