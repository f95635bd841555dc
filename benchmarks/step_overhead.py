"""What the runtime's fixed cost per step would have done to the stored 4 x H100 runs: each
re-predicted with `Cluster.step_overhead` at 0, 0.6 and 1.0 ms, the range the measured
timelines of h200x4-misses showed past the last action (another machine; the stored runs'
probes did not read the term, and nothing here is fitted to their rows).

    cd benchmarks && python3 step_overhead.py > results/step-overhead-whatif.txt   (CPU only)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster

RUNS = [f"results/h100x4-run{i}" for i in range(1, 7)]


def main() -> None:
    for name in RUNS:
        run = Path(name)
        cluster, profiles = Cluster.load(str(run / "cluster.json")), run_profiles(run)
        for overhead in (0.0, 0.6e-3, 1.0e-3):
            fresh = repredicted(run, profiles, replace(cluster, step_overhead=overhead))
            s = summary(comparisons(fresh))
            print(
                f"{run.name} step_overhead {overhead * 1e3:.1f} ms: median "
                f"{s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}, "
                f"{s['within_7_percent']} within 7%, decisions {s['right']}/{s['decisions']}"
            )


if __name__ == "__main__":
    main()
