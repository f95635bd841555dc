"""How well does one run's measurement foretell another's? A floor under #7's worst-case bar.

Each fresh 4-GPU run since h100x4-run19 has missed the bar of every row within 20% by a few
rows, host-bound ones whose own rounds lay far apart. This asks how close the machines come
to themselves: for every configuration measured on several 4-GPU runs of one GPU kind
(H100 runs from 13, H200 runs from 12, every one stored: the same suite, the same
measuring code), each run's
measured step against the median of the other runs' measurements of it, as if those were a
prediction that knew everything about the step but the host's spell on the day. Beside it,
the run's own prediction (from its own profiles and probe) against the same measurement.
CPU only; output: results/repeatability.txt.

Each run's line: rows, then for "others" (the other runs' median) and "own" (this code's
prediction) the median and worst |error| and the rows within 20%.

    cd benchmarks && python3 repeatability.py > results/repeatability.txt
"""

from __future__ import annotations

import statistics
from pathlib import Path

from combine import repredicted

from pipecast.bench.accuracy import Comparison, comparisons

RESULTS = Path(__file__).resolve().parent / "results"
FIRST = {"h100": 13, "h200": 12}
"""The first run of each GPU kind measured by the same suite and code as the later ones."""


def stored(kind: str) -> list[str]:
    """Every stored `<kind>x4-runN` from FIRST[kind] on, in order (a new run joins as it is
    stored)."""
    found = []
    for path in RESULTS.glob(f"{kind}x4-run*"):
        n = path.name.rsplit("run", 1)[1]
        if n.isdigit() and int(n) >= FIRST[kind] and (path / "bench.sqlite").exists():
            found.append((int(n), path.name))
    return [name for _, name in sorted(found)]


GROUPS = {kind: stored(kind) for kind in FIRST}


def line(label: str, errors: list[float]) -> str:
    worst = max(errors)
    within = sum(e <= 0.20 for e in errors)
    return f"{label} {statistics.median(errors):5.1%} {worst:6.1%} {within:3d}"


def run_errors(runs: list[str]) -> dict[str, list[tuple[Comparison, float, float]]]:
    """Run -> (row, |error| of the other runs' median measurement, |error| of the run's own
    prediction) for each row measured on at least two other runs."""
    rows = {run: {c.label: c for c in comparisons(repredicted(RESULTS / run))} for run in runs}
    out: dict[str, list[tuple[Comparison, float, float]]] = {}
    for run in runs:
        out[run] = []
        for label, c in rows[run].items():
            others = [rows[o][label].measured for o in runs if o != run and label in rows[o]]
            if len(others) >= 2:
                guess = statistics.median(others)
                out[run].append((c, abs(guess / c.measured - 1), abs(c.predicted / c.measured - 1)))
    return out


def main() -> None:
    totals: dict[str, list[float]] = {"others": [], "own": []}
    host: dict[str, list[float]] = {"others": [], "own": []}
    for runs in GROUPS.values():
        for run, found in run_errors(runs).items():
            errors: dict[str, list[float]] = {"others": [], "own": []}
            for c, others, own in found:
                for name, e in (("others", others), ("own", own)):
                    errors[name].append(e)
                    totals[name].append(e)
                    if c.host_share >= 0.5:
                        host[name].append(e)
            print(
                f"{run:14s} {len(errors['own']):2d} rows | "
                + " | ".join(line(name, errors[name]) for name in errors),
                flush=True,
            )
    for name in totals:
        print(
            f"{name}: {sum(e <= 0.20 for e in totals[name])} of {len(totals[name])} within 20%, "
            f"median {statistics.median(totals[name]):.1%}; host-bound "
            f"{sum(e <= 0.20 for e in host[name])} of {len(host[name])}, "
            f"median {statistics.median(host[name]):.1%}"
        )


if __name__ == "__main__":
    main()
