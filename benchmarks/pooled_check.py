"""Would the shipped H100 profiles serve better with host costs pooled over every stored H100
run than with one run's? Written after h100x4-run21 and before any run it decides on.

`swap_profiles.py` over the H100 runs 13-21 found that predicting each run with every host
cost the mean over the other runs' profiles of the same model put 479 of 522 rows within
20%, against 455 from its own profile: on machines of one kind, one profile's host reading
carries more noise than the machines differ by. The shipped profiles were h100x4-run18's.
This re-predicts each stored H100 run, as `reference_check.py` does, from `run18+preset`
(h100x4-run18's profiles, read from its run directory, and the `h100-nvlink` preset sized
to the run) and from `pooled+preset` (the same, with every host cost, the split-call cost,
the host issue and the reference loop readings the mean over the pool's profiles of that
model; the H100 pool is POOLS["h100"]).

The rule, decided before the run: the shipped H100 profiles take pooled host costs if, on
the first fresh H100 run after h100x4-run21 (not in the pool, so out of sample), pooled+preset
puts more of its rows within 20% than run18+preset, with a worst no higher. The runs in
the pool are printed too, marked in-sample, and decide nothing. h100x4-run22 decided it: 58
rows within 20% (worst 18.0%) against 57 (worst 20.8%), so the shipped H100 profiles are
now the pooled ones, written by

    cd benchmarks && python3 pooled_check.py --write ../src/pipecast/profile/shipped/h100

(one <workload key>.json each, as pipecast.profile.reference reads them). Reading run18's
profiles from its run directory, not the shipped ones, keeps this output the same after.

`--kind h200` asks the same of the shipped H200 profiles (h200x4-run14's as taken), pooled
over the H200 runs whose profiles read host costs over windows of whole-model passes, as the
H100 pool's do: h200x4-run13 and -run14. Its rule, written after h200x4-run15 had shown
run14's profiles with the `h200-nvlink` preset putting 41 of its 58 rows within 20% (worst
37.5%) and before pooled+preset was computed on it: the shipped H200 profiles take pooled
host costs if, on h200x4-run15 (in neither the pool nor the preset's probes), pooled+preset
puts more rows within 20% than run14+preset, with a worst no higher. Runs after the one that
decided are out of sample too, and are marked "after the pool". After h200x4-run17 the
shipped H200 profiles were pooled over every H200 run from 13 to 17 (`wider_pool.py`); this
script keeps the first pool, the one its rule settled, and its `--write` no longer writes
what ships for H200.

    cd benchmarks && python3 pooled_check.py > results/pooled-check.txt
    cd benchmarks && python3 pooled_check.py --kind h200 > results/pooled-check-h200.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

from combine import repredicted, run_profiles
from error_bands import RUNS
from reference_check import preset_runs

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.pool import pool_host
from pipecast.profile.reference import SOURCES
from pipecast.profile.types import Profile

RESULTS = Path(__file__).resolve().parent / "results"
POOLS = {
    "h100": [f"h100x4-run{i}" for i in range(13, 22)],
    "h200": ["h200x4-run13", "h200x4-run14"],
}


def pooled(
    reference: dict[str, Profile], runs: list[str], every: dict[str, dict[str, Profile]]
) -> dict[str, Profile]:
    """`reference` (by workload key) with host costs the mean over `runs`' profiles of each
    model (`every`: each run's profiles by workload key)."""
    pool: dict[str, list[Profile]] = {}
    for run in runs:
        for key, p in every[run].items():
            pool.setdefault(key, []).append(p)
    return {k: pool_host(p, pool[k]) for k, p in reference.items() if k in pool}


def main(kind: str = "h100", write: Path | None = None) -> None:
    reference = run_profiles(RESULTS / SOURCES[kind])  # by workload key
    source = SOURCES[kind].rsplit("-", 1)[-1]  # "run18"
    every = {run: run_profiles(RESULTS / run) for run in POOLS[kind]}
    pooled_reference = pooled(reference, POOLS[kind], every)
    if write:
        write.mkdir(parents=True, exist_ok=True)
        for key, p in pooled_reference.items():
            p.save(str(write / f"{key}.json"))
        return
    last_pooled = max(RUNS.index(r) for r in POOLS[kind])
    decided = False
    for run, _, preset in preset_runs(kind):
        cells = []
        for label, profiles in {
            f"{source}+preset": reference,
            "pooled+preset": pooled_reference,
        }.items():
            s = summary(comparisons(repredicted(RESULTS / run, profiles, preset)))
            cells.append(
                f"{label} {s['configurations']} {s['median_abs_error']:6.1%} "
                f"{s['worst_abs_error']:6.1%} {s['within_20_percent']:2d} "
                f"{s['right']}/{s['decisions']}"
            )
        if run in POOLS[kind]:
            sample = "in-sample"
        elif RUNS.index(run) > last_pooled:
            sample = "after the pool" if decided else "after the pool: decides the rule"
            decided = True
        else:
            sample = "before the pool's runs"
        print(f"{run:20s} " + " | ".join(cells) + f"  ({sample})", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=sorted(POOLS), default="h100", help="GPU kind")
    parser.add_argument("--write", type=Path, help="write the pooled profiles here instead")
    args = parser.parse_args()
    main(args.kind, args.write)
