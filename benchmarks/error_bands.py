"""How far off the step-time predictions fall, and which way: the 10th and 90th percentiles
of (predicted - measured) / measured over every stored run's eager configurations, apart for
device-bound and host-bound predictions on one GPU and on several, as this checkout
re-predicts them from each run's own profiles and probe (combine.repredicted). The
recommender's ERROR_RANGE
(pipecast.recommend.predict) is this output rounded outward to whole per cents (CPU only,
about 8 minutes; results/error-bands.txt).

    cd benchmarks && python3 error_bands.py > results/error-bands.txt
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from combine import repredicted

from pipecast.bench.accuracy import comparisons

RUNS = (
    [f"h200x4-run{i}" for i in range(7, 12)]
    + [f"h200x2-run{i}" for i in range(1, 4)]
    + [f"h100x4-run{i}" for i in range(1, 13)]
    + ["h100x2-graphs-run1", "h100x2-graphs-run2", "h200x4-graphs-run1"]
    + ["h100x4-graphs-run1", "h100x4-graphs-run2", "h200x4-run12", "h100x4-run13"]
    + ["h100x4-run14", "h100x4-run15", "h100x4-run16", "h200x4-run13", "h100x4-run17"]
    + ["h200x4-run14", "h100x4-run18", "h100x4-run19", "h100x4-run20", "h100x4-run21"]
    + ["h100x4-run22", "h200x4-run15", "h200x4-run16", "h200x4-run17", "h200x2-run4"]
)


def main() -> None:
    results = Path(__file__).resolve().parent / "results"
    errors: dict[str, list[float]] = {
        f"{regime}-bound on {gpus}": []
        for regime in ("device", "host")
        for gpus in ("one GPU", "several GPUs")
    }
    for run in RUNS:
        comps = [c for c in comparisons(repredicted(results / run)) if not c.graphed]
        for c in comps:
            regime = "host" if c.host_bound else "device"
            gpus = "one GPU" if c.gpus == 1 else "several GPUs"
            errors[f"{regime}-bound on {gpus}"].append(c.error)
        print(f"{run}: {len(comps)} eager configurations")
    for regime, values in errors.items():
        fast = sum(e < 0 for e in values) / len(values)
        # "inclusive": linear between the closest ranks, as numpy's default
        deciles = statistics.quantiles(values, n=10, method="inclusive")
        low, high = deciles[0], deciles[-1]
        fifths = statistics.quantiles([abs(e) for e in values], n=5, method="inclusive")
        print(
            f"{regime}: {len(values)} configurations, median {statistics.median(values):+.1%}"
            f", 10th percentile {low:+.1%}, 90th {high:+.1%}"
            f", 80th of |error| {fifths[-1]:.1%}; "
            f"{fast:.0%} predicted fast; ERROR_RANGE {math.floor(low * 100) / 100:+.2f}, "
            f"{math.ceil(high * 100) / 100:+.2f}"
        )


if __name__ == "__main__":
    main()
