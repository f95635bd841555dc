"""Would the shipped profiles serve better with host costs pooled over every stored run of
their GPU kind than over the runs their first pool took? Written after h200x4-run17 (CPU
only; output: results/wider-pool.txt).

Until h200x4-run17 the shipped H200 profiles were h200x4-run14's with host costs the mean
over h200x4-run13 and -run14 (`pooled_check.py --kind h200`, the rule settled on
h200x4-run15); three H200 runs were stored after. The shipped H100 ones pool h100x4-run13
to -run21; h100x4-run22 came after. Each stored run of the kind, from the first in its
pool, is re-predicted as `reference_check.py` does, from the source run's profiles and the
kind's NVLink preset sized to the run, with host costs pooled two ways:

* `first`: over pooled_check.POOLS[kind], the first pool;
* `every`: over WIDER[kind], every run of the kind stored when this was written, less the
  run predicted, so that no run is predicted from its own host reading;
* `earlier` (runs after the first pool only): over the runs of WIDER[kind] stored before
  the run predicted, what a pool kept up to date as the runs came would have held.

Each line: the variant's configurations, median and worst |error|, rows within 20%, picks;
a run in the first pool is in sample for `first` only. Before anything was decided, the
H200 runs after the first pool read: h200x4-run15 `first` 45 rows within 20% (worst 30.2%)
against `every` 51 (27.8%), -run16 46 (29.3%) against 54 (24.3%), -run17 39 (35.0%) against
51 (26.2%); `earlier` put 57 on -run16 (23.6%) and 51 on -run17 (26.2%): better than
`first` on both runs that followed the first pool's adoption, in rows and worst. So the
shipped H200 profiles now pool every H200 run in WIDER["h200"]; the H100 ones stay as they
were (486 against 487 rows, no gain). Written by

    cd benchmarks && python3 wider_pool.py --write ../src/pipecast/profile/shipped/h200

Adopted on evidence read after the runs, not by a rule fixed before them. The rule for the
next fresh H200 run (in neither pool): if `every` (then exactly what ships) puts fewer of
its rows within 20% than `first`, or a higher worst, the shipped H200 profiles go back to
the first pool.

    cd benchmarks && python3 wider_pool.py > results/wider-pool.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

from combine import repredicted, run_profiles
from error_bands import RUNS
from pooled_check import POOLS, pooled
from reference_check import preset_runs

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster
from pipecast.profile.reference import SOURCES
from pipecast.profile.types import Profile

RESULTS = Path(__file__).resolve().parent / "results"
WIDER = {
    "h100": [f"h100x4-run{i}" for i in range(13, 23)],
    "h200": [f"h200x4-run{i}" for i in range(13, 18)],
}


def cell(label: str, run: str, profiles: dict[str, Profile], preset: Cluster) -> tuple[str, int]:
    s = summary(comparisons(repredicted(RESULTS / run, profiles, preset)))
    text = (
        f"{label} {s['configurations']} {s['median_abs_error']:6.1%} "
        f"{s['worst_abs_error']:6.1%} {s['within_20_percent']:2d} {s['right']}/{s['decisions']}"
    )
    return text, int(s["within_20_percent"])


def write(kind: str, to: Path) -> None:
    """The source run's profiles with host costs pooled over WIDER[kind], one
    <workload key>.json each, as pipecast.profile.reference reads them."""
    reference = run_profiles(RESULTS / SOURCES[kind])
    every = {run: run_profiles(RESULTS / run) for run in WIDER[kind]}
    to.mkdir(parents=True, exist_ok=True)
    for key, p in pooled(reference, WIDER[kind], every).items():
        p.save(str(to / f"{key}.json"))


def main() -> None:
    for kind, wider in WIDER.items():
        reference = run_profiles(RESULTS / SOURCES[kind])
        every = {run: run_profiles(RESULTS / run) for run in wider}
        first_pool = pooled(reference, POOLS[kind], every)
        totals = [0, 0]
        first = RUNS.index(POOLS[kind][0])
        for run, _, preset in preset_runs(kind):
            if RUNS.index(run) < first:
                continue
            others = [r for r in wider if r != run]
            a, a_rows = cell("first", run, first_pool, preset)
            b, b_rows = cell("every", run, pooled(reference, others, every), preset)
            totals[0] += a_rows
            totals[1] += b_rows
            if run in POOLS[kind]:
                print(f"{run:14s} {a} | {b} (in the first pool)", flush=True)
                continue
            before = [r for r in wider if RUNS.index(r) < RUNS.index(run)]
            c, _ = cell("earlier", run, pooled(reference, before, every), preset)
            print(f"{run:14s} {a} | {b} | {c}", flush=True)
        print(f"{kind}: first {totals[0]}, every {totals[1]} rows within 20%", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="write the H200 profiles pooled over every run")
    args = parser.parse_args()
    if args.write:
        write("h200", args.write)
    else:
        main()
