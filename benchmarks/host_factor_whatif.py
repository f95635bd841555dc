"""Which host factor carries: stored runs re-predicted with the busy rank's slowdown taken
four ways (CPU only; output: results/host-factor-whatif.txt).

* `profile`: the probe's hostspeed.issue() with n ranks busy over the profile's own reading
  (what the simulator used up to h100x4-run16, and still uses for a profile taken on
  another machine);
* `contention`: the probe's pure-Python loop with n ranks busy over alone (what profiles
  without issue readings get);
* `probe`: the probe's issue reading with n ranks busy over its own reading alone, both
  taken in the same interleaved rounds, the profile's reading left out (Cluster.host_factor
  for a profile taken on the probe's machine, as every stored run's were, since the
  pre-registered decision on h100x4-run16);
* `none`: no factor, the profile's host costs as read (added after h100x4-run13, the
  first suite with host costs read in three windows; not decided in advance);
* `clamped`: the probe's ratio, never below 1 (added after h200x4-run16, whose probe read
  the tiny model's issue 0.913x as long with four ranks busy as alone: busy neighbours do
  not make a host faster, so a ratio under 1 is the reading's own noise, which runs
  0.88-1.18x over the stored probes). Its rule, committed before any run it decides on:
  it replaces `probe` if, on the next fresh 4-GPU run, it puts more rows within 20% with a
  worst no higher.

Of error_bands.py's runs, those whose probe read hostspeed.issue() (only they differ);
each line gives a variant's median and worst |error|, the rows within 20%, the host-bound
median and the worst memory error.

    cd benchmarks && python3 host_factor_whatif.py > results/host-factor-whatif.txt
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from combine import repredicted
from error_bands import RUNS

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster

MEASURED = Cluster.host_factor


def profile(self: Cluster, busy: int, profiled_issue: float = 0.0, on: str = "") -> float:
    return MEASURED(self, busy, profiled_issue)  # no machine named: the profile's reading


def contention(self: Cluster, busy: int, profiled_issue: float = 0.0, on: str = "") -> float:
    return MEASURED(self, busy, 0.0)


def probe(self: Cluster, busy: int, profiled_issue: float = 0.0, on: str = "") -> float:
    return MEASURED(self, busy, profiled_issue, self.machine)  # one machine: the probe's ratio


def none(self: Cluster, busy: int, profiled_issue: float = 0.0, on: str = "") -> float:
    return 1.0


def clamped(self: Cluster, busy: int, profiled_issue: float = 0.0, on: str = "") -> float:
    return max(1.0, probe(self, busy, profiled_issue, on))


VARIANTS: dict[str, Callable[..., float]] = {
    "profile": profile,
    "contention": contention,
    "probe": probe,
    "none": none,
    "clamped": clamped,
}


def main() -> None:
    results = Path(__file__).resolve().parent / "results"
    totals = {name: [0, 0] for name in VARIANTS}
    for run in RUNS:
        if not Cluster.load(str(results / run / "cluster.json")).host_issue:
            continue  # a probe without issue readings: every variant is the contention one
        cells = []
        for name, factor in VARIANTS.items():
            Cluster.host_factor = factor  # type: ignore[method-assign]
            s = summary(comparisons(repredicted(results / run)))
            totals[name][0] += s["within_20_percent"]
            totals[name][1] += s["configurations"]
            cells.append(
                f"{name} {s['median_abs_error']:6.1%} {s['worst_abs_error']:6.1%} "
                f"{s['within_20_percent']:2d} {s.get('host_bound_median_abs_error', 0.0):6.1%} "
                f"{s['worst_abs_memory_error']:5.1%}"
            )
        Cluster.host_factor = MEASURED  # type: ignore[method-assign]
        print(f"{run:20s} " + " | ".join(cells), flush=True)
    for name, (within, rows) in totals.items():
        print(f"{name}: {within} of {rows} within 20%")


if __name__ == "__main__":
    main()
