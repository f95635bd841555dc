"""Which profiled micro-batch size should a block's host cost come from? The profile reads the
host at every size it profiles; the predictor takes the smallest (profile/types.py,
_interp_cost). Each stored run is re-predicted with each estimator in its place, everything
else as the final code does it.

    cd benchmarks && python3 host_size_whatif.py h100x4-graphs-run2 h100x4-graphs-run1 ...

Estimators: `smallest` (the predictor's), `median` (over sizes), `second` (the second
smallest size), `max` (the largest reading), `maxbound` (the size whose whole-model forward
read the most host time among those whose passes were host-bound: host >= 0.95 x device).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.pool import HOST_COSTS, with_host_costs
from pipecast.profile.types import BlockCost, Profile

RESULTS = Path(__file__).parent / "results"
ESTIMATORS = ("smallest", "median", "second", "max", "maxbound")


def _source_size(p: Profile, how: str) -> int | None:
    """The one size every block's host costs come from, or None (per block, per field)."""
    sizes = sorted(p.micro_batches)
    if how == "second":
        return sizes[1] if len(sizes) > 1 else sizes[0]
    if how == "maxbound":
        host = {s: sum(b.costs[s].host_forward for b in p.blocks) for s in sizes}
        device = {s: sum(b.costs[s].forward for b in p.blocks) for s in sizes}
        bound = [s for s in sizes if host[s] >= 0.95 * device[s]] or sizes[:1]
        return max(bound, key=lambda s: host[s])
    return None


def estimated(p: Profile, how: str) -> Profile:
    """`p` with its smallest size's host costs replaced by the estimator's."""
    if how == "smallest":
        return p
    sizes = sorted(p.micro_batches)
    source = _source_size(p, how)

    def estimated(i: int, mb: int, _: BlockCost) -> dict[str, float] | None:
        if mb != sizes[0]:
            return None
        costs = p.blocks[i].costs
        new = {}
        for field in HOST_COSTS:
            values = [getattr(costs[s], field) for s in sizes]
            if source is not None:
                new[field] = getattr(costs[source], field)
            elif how == "median":
                new[field] = statistics.median(values)
            else:  # max
                new[field] = max(values)
        return new

    return with_host_costs(p, estimated)


def main(runs: list[str]) -> None:
    worst: dict[str, list[tuple[float, float]]] = {h: [] for h in ESTIMATORS}
    for run in runs:
        path = RESULTS / run
        base = run_profiles(path)
        for how in ESTIMATORS:
            profiles = {k: estimated(p, how) for k, p in base.items()}
            s = summary(comparisons(repredicted(path, profiles)))
            worst[how].append((s["median_abs_error"], s["worst_abs_error"]))
            print(
                f"{run:20s} {how:9s} median {s['median_abs_error']:6.1%} worst "
                f"{s['worst_abs_error']:6.1%} within 20% {s['within_20_percent']}/"
                f"{s['configurations']} host-bound median {s['host_bound_median_abs_error']:6.1%}"
                f" picks {s['right']}/{s['decisions']}",
                flush=True,
            )
    for how, v in worst.items():
        print(
            f"{how:9s} over {len(v)} runs: median of medians "
            f"{statistics.median(m for m, _ in v):.1%}, median of worsts "
            f"{statistics.median(w for _, w in v):.1%}, largest worst {max(w for _, w in v):.1%}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
