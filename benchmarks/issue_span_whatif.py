"""Does issuing block by block explain where host-bound predictions fall short? The
simulator lets an action's device end as soon as both its host and its device totals allow
(`totals`); `span` also holds it to the span of its blocks, the device running each block
once the host has begun issuing it (pipecast.simulate.issue). Every stored run is
re-predicted both ways (CPU only, about 5 minutes):

    cd benchmarks && python3 issue_span_whatif.py > results/issue-span-whatif.txt

Each line: a run, then per variant the median and worst |error| and the rows within 20%
(eager and CUDA-graphed rows; a graphed action is one launch and has no span); last, the
totals, and the signed median error of the host-bound rows over one GPU and over several.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted
from error_bands import RUNS

import pipecast.simulate.engine as engine
from pipecast.bench.accuracy import comparisons

RESULTS = Path(__file__).parent / "results"
SPAN = engine._span


def _no_span(*args: Any) -> float:
    return 0.0


def main() -> None:
    variants = {"totals": _no_span, "span": SPAN}
    totals: dict[str, dict[str, Any]] = {
        name: {"within": 0, "rows": 0, "medians": [], "one": [], "several": []} for name in variants
    }
    for run in RUNS:
        cells = []
        for name, fn in variants.items():
            engine._span = fn  # type: ignore[assignment]
            cs = comparisons(repredicted(RESULTS / run))
            errors = [abs(c.error) for c in cs]
            within = sum(e <= 0.2 for e in errors)
            t = totals[name]
            t["within"] += within
            t["rows"] += len(cs)
            t["medians"].append(statistics.median(errors))
            for c in cs:
                if c.host_bound and not c.graphed:
                    t["one" if c.gpus == 1 else "several"].append(c.error)
            cells.append(f"{name} {statistics.median(errors):6.1%} {max(errors):6.1%} {within:2d}")
        engine._span = SPAN
        print(f"{run:20s} " + " | ".join(cells), flush=True)
    base = totals["totals"]["medians"]
    for name, t in totals.items():
        better = sum(m < b - 1e-9 for m, b in zip(t["medians"], base, strict=True))
        worse = sum(m > b + 1e-9 for m, b in zip(t["medians"], base, strict=True))
        one, several = (f"{statistics.median(t[k]):+.1%} ({len(t[k])})" for k in ("one", "several"))
        print(
            f"{name}: {t['within']} of {t['rows']} within 20%; run medians better on {better}, "
            f"worse on {worse}; host-bound signed median: one GPU {one}, several {several}"
        )


if __name__ == "__main__":
    main()
