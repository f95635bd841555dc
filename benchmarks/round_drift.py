"""Does the machine hold its speed through a suite? For each stored run measured in four or
more rounds, each configuration's rounds over that configuration's own median, and the median
of that ratio over the configurations, round by round, apart for device-bound and host-bound
predictions (CPU only, seconds; output: results/round-drift.txt).

A device that holds its speed reads 1.000 in every round; a host that slows in the last
call reads above 1 in the last rounds of the host-bound rows only.

    cd benchmarks && python3 round_drift.py > results/round-drift.txt
"""

from __future__ import annotations

import statistics
from pathlib import Path

from combine import repredicted
from error_bands import RUNS

from pipecast.bench.accuracy import comparisons

RESULTS = Path(__file__).resolve().parent / "results"
MIN_ROUNDS = 4


def main() -> None:
    for run in RUNS:
        rows = [c for c in comparisons(repredicted(RESULTS / run)) if not c.graphed]
        for host_bound in (False, True):
            measured = [
                [r / statistics.median(c.rounds) for r in c.rounds]
                for c in rows
                if len(c.rounds) >= MIN_ROUNDS and c.host_bound == host_bound
            ]
            if not measured:
                continue
            n = min(len(m) for m in measured)
            ratios = " ".join(f"{statistics.median(m[i] for m in measured):.3f}" for i in range(n))
            kind = "host-bound" if host_bound else "device-bound"
            print(f"{run:20s} {kind:12s} {len(measured):3d} rows  {ratios}")


if __name__ == "__main__":
    main()
