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
from typing import Any

from whatif import compare, totals

import pipecast.simulate.simulator as engine

SPAN = engine._span


def _no_span(*args: Any) -> float:
    return 0.0


def _use(fn: Any) -> Any:
    def patch() -> None:
        engine._span = fn

    return patch


def main() -> None:
    runs = compare({"totals": _use(_no_span), "span": _use(SPAN)}, _use(SPAN))
    for name, per_run in runs.items():
        signed = {
            k: [
                c.error
                for cs in per_run
                for c in cs
                if c.host_bound and not c.graphed and (c.gpus == 1) == (k == "one")
            ]
            for k in ("one", "several")
        }
        one, several = (f"{statistics.median(v):+.1%} ({len(v)})" for v in signed.values())
        print(
            f"{name}: {totals(per_run, runs['totals'])}; host-bound signed median: one GPU "
            f"{one}, several {several}"
        )


if __name__ == "__main__":
    main()
