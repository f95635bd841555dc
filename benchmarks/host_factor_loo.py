"""Would one flat factor on every host cost, on top of what each run's probe read, carry from
machine to machine? The eight 4 x H100 runs re-predicted with the factor at 1.0-1.4, and
for each run the factor that gave the lowest mean median over the other seven (leave one
run out), judged on the run left out (CPU only; output: results/host-factor-loo.txt).

    cd benchmarks && python3 host_factor_loo.py > results/host-factor-loo.txt
"""

from __future__ import annotations

import statistics
from pathlib import Path

from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster

RUNS = [f"h100x4-run{i}" for i in range(1, 9)]
FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4)


def main() -> None:
    results = Path(__file__).resolve().parent / "results"
    measured = Cluster.host_factor
    profiles = {run: run_profiles(results / run) for run in RUNS}
    table: dict[tuple[float, str], dict[str, float | int]] = {}
    try:
        for k in FACTORS:

            def scaled(self: Cluster, busy: int, issue: float = 0.0, k: float = k) -> float:
                return k * measured(self, busy, issue)

            Cluster.host_factor = scaled  # type: ignore[method-assign]
            for run in RUNS:
                rows = repredicted(results / run, profiles[run])
                table[(k, run)] = summary(comparisons(rows))
    finally:
        Cluster.host_factor = measured  # type: ignore[method-assign]
    print("median |error| per run (%), and the picks right over all runs")
    print("factor " + " ".join(f"{run[-4:]:>6s}" for run in RUNS))
    for k in FACTORS:
        cells = " ".join(f"{100 * float(table[(k, r)]['median_abs_error']):6.1f}" for r in RUNS)
        picks = sum(int(table[(k, r)]["right"]) for r in RUNS)
        print(f"{k:6.2f} {cells}   picks {picks}")
    print("\nleave one run out: the factor best on the other seven, on the run left out")
    for run in RUNS:
        others = [r for r in RUNS if r != run]
        best = min(
            FACTORS,
            key=lambda k: statistics.mean(float(table[(k, r)]["median_abs_error"]) for r in others),
        )
        held, plain = table[(best, run)], table[(1.0, run)]
        print(
            f"{run}: factor {best:.2f}: median {100 * float(held['median_abs_error']):.1f}% "
            f"(1.00: {100 * float(plain['median_abs_error']):.1f}%), worst "
            f"{100 * float(held['worst_abs_error']):.1f}% "
            f"(1.00: {100 * float(plain['worst_abs_error']):.1f}%)"
        )


if __name__ == "__main__":
    main()
