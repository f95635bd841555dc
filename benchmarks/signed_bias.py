"""Which rows does this code predict fast or slow run after run? The stored 4-GPU runs of
one suite and measuring code (repeatability.GROUPS: H100 runs from 13, H200 runs from 12),
each re-predicted from its own profiles and probe, their signed errors grouped by GPU kind,
what binds the step (host-bound: the host issues work for at least half of it), the GPUs
and the strategy (one GPU, DDP, pipeline). CPU only; output: results/signed-bias.txt.

Each line: the group, its rows, the median of (predicted - measured) / measured and the
rows within 20%. A group whose median sits far from 0 over many runs errs one way by more
than the host's spells, which change sign from run to run.

    cd benchmarks && python3 signed_bias.py > results/signed-bias.txt
"""

from __future__ import annotations

import statistics

from combine import repredicted
from repeatability import GROUPS, RESULTS

from pipecast.bench.accuracy import Comparison, comparisons


def strategy(c: Comparison) -> str:
    if "DDP" in c.label:
        return "DDP"
    return "one GPU" if c.gpus == 1 else "pipeline"


def main() -> None:
    for kind, runs in GROUPS.items():
        groups: dict[tuple[str, int, str], list[float]] = {}
        for run in runs:
            for c in comparisons(repredicted(RESULTS / run)):
                bound = "host" if c.host_share >= 0.5 else "device"
                groups.setdefault((bound, c.gpus, strategy(c)), []).append(c.error)
        print(f"{kind}: {len(runs)} runs ({runs[0]} to {runs[-1]})")
        for (bound, gpus, name), errors in sorted(groups.items()):
            print(
                f"  {bound:6s}-bound {gpus} GPU(s) {name:8s} {len(errors):4d} rows, "
                f"median {statistics.median(errors):+6.1%}, "
                f"{sum(abs(e) <= 0.20 for e in errors):4d} within 20%"
            )


if __name__ == "__main__":
    main()
