"""Would a user who profiles a model on each visit predict better with host costs pooled
over the visits (what `pipecast recommend --recalibrate` now keeps on GPUs)? Each stored
4-GPU run of the same suite and measuring code (repeatability.GROUPS: H100 runs from 13,
H200 runs from 12) is re-predicted from its own profiles and probe (`own`), and from the
same with every host cost, the split-call cost, the host issue and the loop reading the
mean over that model's profiles from this run and the earlier ones of its GPU kind, the
newest HISTORY (8), as the cache keeps them (`history`, pipecast.profile.pool.pool_host:
what the cache would hold had each run been a visit; the first run of each kind has no
history and is left out). Only earlier runs pool, so no run's own measurements shaped its
prediction. CPU only; output: results/history-pool.txt.

Written after h200x4-run15, with every run it then covered already stored; h200x4-run16 came
after, and is out of sample for this pooling's design. `--plot` also draws
each run's worst row three ways: its own prediction, the pooled one, and the other runs'
median measurement (repeatability.py), against #7's 20%.

    cd benchmarks && python3 history_pool.py --plot results/history-pool.png \
        > results/history-pool.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from combine import repredicted, run_profiles
from repeatability import GROUPS, run_errors

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.pool import pool_host
from pipecast.recommend.calibrate import HISTORY

RESULTS = Path(__file__).resolve().parent / "results"


def main(plot: Path | None = None) -> None:
    worst: dict[str, dict[str, float]] = {"own": {}, "history": {}, "others": {}}
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
                if name == "own":
                    rows += int(s["configurations"])
                totals[name] += int(s["within_20_percent"])
                worst[name][run] = float(s["worst_abs_error"])
                cells.append(
                    f"{name} {s['median_abs_error']:5.1%} {s['worst_abs_error']:6.1%} "
                    f"{s['within_20_percent']:2d} {s['right']}/{s['decisions']}"
                )
            print(f"{run:14s} pools {len(visits):2d} | " + " | ".join(cells), flush=True)
        print(
            f"{kind}: own {totals['own']} of {rows} within 20%, "
            f"history {totals['history']} of {rows}"
        )
        if plot:
            for run, found in run_errors(runs).items():
                worst["others"][run] = max(others for _, others, _ in found)
    if plot:
        draw(worst, plot)


def draw(worst: dict[str, dict[str, float]], path: Path) -> None:
    runs = list(worst["own"])
    fig, ax = plt.subplots(figsize=(9, 3.6))
    styles = {
        "own": ("own profiles and probe", "o", "tab:red"),
        "history": ("host costs pooled with earlier runs'", "s", "tab:blue"),
        "others": ("other runs' median measurement", "^", "tab:gray"),
    }
    for name, (label, marker, color) in styles.items():
        ys = [100 * worst[name][r] for r in runs]
        ax.plot(range(len(runs)), ys, marker=marker, color=color, label=label, lw=1)
    ax.axhline(20, ls="--", color="black", lw=0.8)
    ax.set_xticks(range(len(runs)), [r.replace("x4-run", " ") for r in runs], fontsize=8)
    ax.set_ylabel("worst |error| of a run, %")
    ax.set_title("each 4-GPU run's worst row, three ways (dashed: #7's 20%)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, help="also draw the worst rows here (PNG)")
    main(parser.parse_args().plot)
