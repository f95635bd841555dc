"""Do predictions made without the GPUs err in the bands `recommend` quotes? ERROR_RANGE
(error_bands.py) is read from each run's own profiles and probe; `pipecast recommend
--cluster h100-nvlink` (or h200-nvlink) on a machine without them predicts from the shipped
profiles and the preset instead, as reference_check.py's `shipped+preset` does. This gives
the same percentiles for that path, over the same runs less the shipped profiles' sources
(CPU only; output: results/shipped-bands.txt). The H100 runs 13-21 and H200 runs 13-17 are
in sample for the shipped profiles' pooled host costs.

    cd benchmarks && python3 shipped_bands.py > results/shipped-bands.txt
"""

from __future__ import annotations

import statistics
from pathlib import Path

from combine import repredicted
from reference_check import preset_runs, shipped_by_key

from pipecast.bench.accuracy import comparisons
from pipecast.recommend.predict import ERROR_RANGE

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    references = shipped_by_key()
    errors: dict[tuple[str, str], list[float]] = {key: [] for key in ERROR_RANGE}
    for run, kind, preset in preset_runs():
        for c in comparisons(repredicted(RESULTS / run, references[kind], preset)):
            if not c.graphed:
                key = (
                    "host" if c.host_bound else "device",
                    "one GPU" if c.gpus == 1 else "several GPUs",
                )
                errors[key].append(c.error)
    inside_all = 0
    for (regime, gpus), values in errors.items():
        deciles = statistics.quantiles(values, n=10, method="inclusive")
        low, high = ERROR_RANGE[(regime, gpus)]
        inside = sum(low <= e <= high for e in values)
        inside_all += inside
        print(
            f"{regime}-bound on {gpus}: {len(values)} configurations, median "
            f"{statistics.median(values):+.1%}, 10th percentile {deciles[0]:+.1%}, 90th "
            f"{deciles[-1]:+.1%}; within ERROR_RANGE ({low:+.2f}, {high:+.2f}): "
            f"{inside / len(values):.0%}"
        )
    rows = sum(len(v) for v in errors.values())
    print(f"all: {inside_all} of {rows} within their ERROR_RANGE ({inside_all / rows:.0%})")


if __name__ == "__main__":
    main()
