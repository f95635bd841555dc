"""Would a fresh profile predict better with its host costs pooled with the shipped ones?

`pipecast recommend` on a GPU machine profiles the model there and predicts from that one
profile (pooled over earlier visits to the same machine once the calibration cache holds
them: history_pool.py). Its host costs are read within one spell of the host. The shipped
profiles of its GPU kind carry host costs that are the mean over several runs' profiles
(pooled_check.py, wider_pool.py), and every stored run's machine read the same CPU
("Intel(R) Xeon(R) Processor", 2,100 MHz, in the `machine_state.jsonl` of every run that
records it). This asks, of every stored run but the shipped profiles' sources
(reference_check.preset_runs), what a first visit would predict with each host cost the
mean of its own profile's and the shipped profile's, the shipped pool counted as one
reading (`prior`), everything else (device times, memory, the probe) the run's own, against
its own profile alone (`own`). CPU only; output: results/prior-pool-whatif.txt.

Written after h200x2-run4, with every run it covers stored: nothing here is out of sample
for the question, and the shipped pools hold H100 runs 13-21 and H200 runs 13-17 (those
lines are marked "in the pool": their own reading is inside the prior too).

    cd benchmarks && python3 prior_pool_whatif.py > results/prior-pool-whatif.txt
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from combine import repredicted, run_profiles
from pooled_check import POOLS
from reference_check import preset_runs, shipped_by_key
from wider_pool import WIDER

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.pool import pool_host
from pipecast.profile.types import Profile

RESULTS = Path(__file__).resolve().parent / "results"
IN_POOL = set(POOLS["h100"]) | set(WIDER["h200"])
"""The runs whose host costs the shipped profiles pool."""


def with_prior(own: dict[str, Profile], shipped: dict[str, Profile]) -> dict[str, Profile]:
    """Each of `own`'s profiles (one reading each) with its host costs pooled with the
    shipped profile of the same workload, that pool counted as one reading; profiles with
    none shipped as they are."""
    return {
        key: p if key not in shipped else pool_host(p, [p, replace(shipped[key], host_pooled=1)])
        for key, p in own.items()
    }


def main() -> None:
    references = shipped_by_key()
    totals: dict[tuple[str, str], list[int]] = {}
    worst: dict[str, list[float]] = {}
    for run, kind, _ in preset_runs():
        own = run_profiles(RESULTS / run)
        group = "in the pool" if run in IN_POOL else "outside it"
        cells = []
        for label, profiles in (("own", own), ("prior", with_prior(own, references[kind]))):
            s = summary(comparisons(repredicted(RESULTS / run, profiles)))
            t = totals.setdefault((group, label), [0, 0, 0, 0])
            t[0] += s["within_20_percent"]
            t[1] += s["configurations"]
            t[2] += s["worst_abs_error"] <= 0.20
            t[3] += 1
            worst.setdefault(label, []).append(s["worst_abs_error"])
            cells.append(
                f"{label} {s['configurations']} {s['median_abs_error']:6.1%} "
                f"{s['worst_abs_error']:6.1%} {s['within_20_percent']:2d} "
                f"{s['right']}/{s['decisions']}"
            )
        print(f"{run:20s} " + " | ".join(cells) + f"  ({group})", flush=True)
    for (group, label), (within, rows, good, runs) in sorted(totals.items()):
        print(
            f"{group}, {label}: {within} of {rows} rows within 20%, "
            f"worst within 20% on {good} of {runs} runs"
        )
    for label, values in worst.items():
        print(f"{label}: median of the runs' worst rows {statistics.median(values):.1%}")


if __name__ == "__main__":
    main()
