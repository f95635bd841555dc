"""Is a host-bound miss the profile's moment or the measurement's? Each stored run is
re-predicted from its own profiles, from each other run's, and from profiles whose host
costs are the mean over all the runs given or over all but its own (its own device costs;
every run's own cluster; the host_issue ratio left out, since it would tie a profile to its
run's probe).

    cd benchmarks && python3 swap_profiles.py h100x4-run1 h100x4-run2 h100x4-run3 h100x4-run4
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster
from pipecast.profile.pool import HOST_COSTS, with_host_costs
from pipecast.profile.types import Profile

RESULTS = Path(__file__).parent / "results"


def mean_host(profiles: list[Profile], base: Profile | None = None) -> Profile:
    """`base` (default: the first profile) with every host cost the mean over `profiles`
    (same model)."""
    pooled = with_host_costs(
        base or profiles[0],
        lambda i, mb, _: {
            h: statistics.mean(getattr(p.blocks[i].costs[mb], h) for p in profiles)
            for h in HOST_COSTS
        },
    )
    return replace(
        pooled,
        host_split_call=statistics.mean(p.host_split_call for p in profiles),
        host_issue=0.0,
    )


def main() -> None:
    runs = sys.argv[1:]
    profiles = {
        r: {k: replace(p, host_issue=0.0) for k, p in run_profiles(RESULTS / r).items()}
        for r in runs
    }
    for r in runs:
        cluster = replace(Cluster.load(str(RESULTS / r / "cluster.json")), host_issue={})
        variants = {"own": profiles[r]} | {f"from {o}": profiles[o] for o in runs if o != r}
        variants["mean of all"] = {
            k: mean_host([profiles[o][k] for o in runs]) for k in profiles[r]
        }
        variants["mean of the others"] = {
            k: mean_host([profiles[o][k] for o in runs if o != r], profiles[r][k])
            for k in profiles[r]
        }
        for name, chosen in variants.items():
            s = summary(comparisons(repredicted(RESULTS / r, chosen, cluster)))
            print(
                f"{r} profiles {name:18s} median {s['median_abs_error']:.1%}, worst "
                f"{s['worst_abs_error']:.1%}, host-bound median "
                f"{s.get('host_bound_median_abs_error', 0.0):.1%}, {s['within_20_percent']} "
                f"within 20%, picks {s['right']}/{s['decisions']}"
            )


if __name__ == "__main__":
    main()
