"""How well does a user without the GPUs fare? Every stored H100/H200 run re-predicted three
ways (CPU only; output: results/reference-check.txt):

* `own`: from the profiles and probe the run took (what the stored runs are judged by);
* `source+preset`: from the profiles of the run the shipped ones come from
  (pipecast.profile.reference.SOURCES: h100x4-run18 or h200x4-run14, taken on another
  machine on another day, read from its run directory) and the `h100-nvlink`/`h200-nvlink`
  preset sized to the run's GPUs;
* `shipped+preset`: from the profiles pipecast ships for that GPU kind and the same preset,
  which is what `pipecast recommend --cluster h100-nvlink` predicts from on a machine
  without GPUs. The H100 ones are h100x4-run18's with host costs the mean over
  h100x4-run13 to -run21 (`pooled_check.py`, adopted after h100x4-run22), so those nine
  runs are in sample for host costs; the H200 ones are h200x4-run14's with host costs the
  mean over h200x4-run13 to -run17 (`wider_pool.py`, after h200x4-run17; over -run13 and
  -run14 before, `pooled_check.py --kind h200`), so those five are in sample.

The run the shipped profiles come from is left out. The presets are medians over the stored
probes, this run's among them (one of 22 or 12), except for runs after the presets were
fixed (h100x4-run19 to -run22, h200x4-run15 to -run17); h100x4-run22 is out of sample on
every count (`wider_pool.py` predicts each H200 run from a pool without it).

Each line: a variant's configurations, median and worst |error|, rows within 20%, picks.

    cd benchmarks && python3 reference_check.py > results/reference-check.txt
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

from combine import repredicted, run_profiles
from error_bands import RUNS

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster
from pipecast.hardware.presets import PRESETS, gpu_kind
from pipecast.models.workload import Workload
from pipecast.profile.reference import SOURCES, shipped
from pipecast.profile.types import Profile

RESULTS = Path(__file__).resolve().parent / "results"


def preset_runs(kind: str | None = None) -> Iterator[tuple[str, str, Cluster]]:
    """Every stored run (of `kind`, else of any) but the shipped profiles' sources, in RUNS's
    order: the run, its GPU kind and that kind's NVLink preset sized to the run."""
    for run in RUNS:
        own = Cluster.load(str(RESULTS / run / "cluster.json"))
        found = gpu_kind(own.device) or "h100"
        if (kind is None or found == kind) and run != SOURCES[found]:
            yield run, found, PRESETS[f"{found}-nvlink"].subset(own.world)


def shipped_by_key() -> dict[str, dict[str, Profile]]:
    """The profiles pipecast ships, by GPU kind and workload key."""
    return {
        kind: {Workload.from_dict(p.workload).key: p for p in shipped(kind)} for kind in SOURCES
    }


def main() -> None:
    references = shipped_by_key()
    sources = {kind: run_profiles(RESULTS / run) for kind, run in SOURCES.items()}
    totals: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    for run, kind, preset in preset_runs():
        cells = []
        for label, fresh in {
            "own": repredicted(RESULTS / run),
            "source+preset": repredicted(RESULTS / run, sources[kind], preset),
            "shipped+preset": repredicted(RESULTS / run, references[kind], preset),
        }.items():
            s = summary(comparisons(fresh))
            totals.setdefault(label, []).append(s["median_abs_error"])
            c = counts.setdefault(label, [0, 0, 0, 0])
            for i, key in enumerate(("within_20_percent", "configurations", "right", "decisions")):
                c[i] += s[key]
            cells.append(
                f"{label} {s['configurations']} {s['median_abs_error']:6.1%} "
                f"{s['worst_abs_error']:6.1%} {s['within_20_percent']:2d} "
                f"{s['right']}/{s['decisions']}"
            )
        print(f"{run:20s} " + " | ".join(cells), flush=True)
    for label, (within, rows, right, decisions) in counts.items():
        print(
            f"{label}: {within} of {rows} within 20%, picks {right} of {decisions}, "
            f"median of the run medians {statistics.median(totals[label]):.1%}"
        )


if __name__ == "__main__":
    main()
