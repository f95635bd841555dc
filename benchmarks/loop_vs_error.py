"""Does the pure-Python loop read while a model was profiled tell which way that model's
host-bound predictions will miss? Over the H100 runs 13-22 (CPU only; output:
results/loop-vs-error.txt): for each run and model, the profile's loop reading
(Profile.host_reference) and the signed median error of that model's host-bound rows (host
share 50% or more) as this checkout re-predicts them from the run's own profiles and probe.
h100x4-run21 and -run22 missed VGG-16/CIFAR-10 fast after profiles that read the loop fast;
if the loop told the host's spell, a correction by it would be the next thing to try.

    cd benchmarks && python3 loop_vs_error.py > results/loop-vs-error.txt
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = [f"h100x4-run{i}" for i in range(13, 23)]


def main() -> None:
    points: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for run in RUNS:
        loop = {
            (p.model, p.dataset): p.host_reference for p in run_profiles(RESULTS / run).values()
        }
        errors: dict[tuple[str, str], list[float]] = defaultdict(list)
        for c in comparisons(repredicted(RESULTS / run)):
            if c.host_share is not None and c.host_share >= 0.5:
                model, dataset = c.label.split(" ")[0].split("/")
                errors[(model, dataset)].append(c.predicted / c.measured - 1)
        for key, errs in errors.items():
            if key in loop:
                points[key].append((loop[key], statistics.median(errs)))
                print(
                    f"{run:14s} {'/'.join(key):24s} loop {loop[key] * 1e3:5.1f} ms  "
                    f"host-bound median {statistics.median(errs):+6.1%} ({len(errs)} rows)"
                )
    xs = [x for pts in points.values() for x, _ in pts]
    ys = [y for pts in points.values() for _, y in pts]
    print(f"all: {len(xs)} model-runs, correlation {statistics.correlation(xs, ys):+.2f}")
    within_x, within_y = [], []
    for key, pts in points.items():
        mx, my = statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts)
        within_x += [x - mx for x, _ in pts]
        within_y += [y - my for _, y in pts]
        r = statistics.correlation([x for x, _ in pts], [y for _, y in pts])
        print(f"{'/'.join(key):24s} {len(pts)} runs, correlation {r:+.2f}")
    print(f"within each model: correlation {statistics.correlation(within_x, within_y):+.2f}")


if __name__ == "__main__":
    main()
