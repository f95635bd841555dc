"""How far off were the predictions when the host ran slower or faster than it did while the
model was profiled? Every stored run's eager rows (error_bands.RUNS), re-predicted by this
checkout, grouped by the pure-Python loop's reading around each measurement over the
profile's own (`host_drift`): 1.25x or more, between, 0.8x or less; apart for host-bound and
device-bound predictions. The recommender's note on a slowed host
(pipecast.recommend.host_drift) rests on this (CPU only, about a minute):

    cd benchmarks && python3 host_drift_rows.py > results/host-drift-rows.txt
"""

from __future__ import annotations

import statistics
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted
from error_bands import RUNS

from pipecast.bench.accuracy import comparisons

GROUPS = ("slower, 1.25x or more", "between", "faster, 0.8x or less")


def group(drift: float) -> str:
    return GROUPS[0] if drift >= 1.25 else GROUPS[2] if drift <= 0.8 else GROUPS[1]


def main() -> None:
    errors: dict[tuple[str, str], list[float]] = {}
    for run in RUNS:
        for c in comparisons(repredicted(Path(__file__).parent / "results" / run)):
            if c.graphed or not c.host_drift:
                continue
            regime = "host-bound" if c.host_bound else "device-bound"
            errors.setdefault((regime, group(c.host_drift)), []).append(c.error)
    for regime in ("host-bound", "device-bound"):
        for g in GROUPS:
            v = errors.get((regime, g), [])
            if not v:
                continue
            print(
                f"{regime}, host {g}: {len(v)} rows, signed median "
                f"{statistics.median(v):+.1%}, |error| median "
                f"{statistics.median(abs(e) for e in v):.1%}, beyond 20%: "
                f"{sum(abs(e) > 0.2 for e in v)}"
            )


if __name__ == "__main__":
    main()
