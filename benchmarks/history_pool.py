"""Would a user who profiles a model on each visit predict better with host costs pooled
over the visits (what `pipecast recommend --recalibrate` now keeps on GPUs)? Each stored
4-GPU run of the same suite and measuring code (H100 runs 13-22, H200 runs 12-15) is
re-predicted from its own profiles and probe (`own`), and from the same with every host
cost, the split-call cost, the host issue and the loop reading the mean over that model's
profiles from this run and the earlier ones of the GPU kind, the newest HISTORY (8) as the
cache keeps them (`history`,
pipecast.profile.pool.pool_host: what the cache would hold had each run been a visit;
the first run of each kind has no history and is left out). Only earlier runs pool, so each
run's own measurements never shaped its prediction. CPU only; output:
results/history-pool.txt.

Written after h200x4-run15, with every run it covers already stored.

    cd benchmarks && python3 history_pool.py > results/history-pool.txt
"""

from __future__ import annotations

from pathlib import Path

from combine import repredicted, run_profiles
from repeatability import GROUPS

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.pool import pool_host
from pipecast.recommend.calibrate import HISTORY

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    for kind, runs in GROUPS.items():
        profiles = {run: run_profiles(RESULTS / run) for run in runs}
        totals = {"own": 0, "history": 0}
        rows = 0
        for k, run in enumerate(runs[1:], start=1):
            visits = runs[max(0, k + 1 - HISTORY) : k + 1]  # the newest, as the cache keeps
            history = {
                key: pool_host(p, [profiles[r][key] for r in visits if key in profiles[r]])
                for key, p in profiles[run].items()
            }
            cells = []
            for name, fresh in (
                ("own", repredicted(RESULTS / run)),
                ("history", repredicted(RESULTS / run, history)),
            ):
                s = summary(comparisons(fresh))
                totals[name] += int(s["within_20_percent"])
                cells.append(
                    f"{name} {s['median_abs_error']:5.1%} {s['worst_abs_error']:6.1%} "
                    f"{s['within_20_percent']:2d} {s['right']}/{s['decisions']}"
                )
            rows += int(summary(comparisons(repredicted(RESULTS / run)))["configurations"])
            print(f"{run:14s} pools {len(visits):2d} | " + " | ".join(cells), flush=True)
        print(
            f"{kind}: own {totals['own']} of {rows} within 20%, "
            f"history {totals['history']} of {rows}"
        )


if __name__ == "__main__":
    main()
