"""Does a forward cost its host more right after a backward? Every stored run re-predicted
with the host time of each pipeline forward that follows a backward action on its rank
(B, W or BW) raised by a premium on its ops (CPU only, seconds):

    cd benchmarks && python3 forward_after_backward_whatif.py \
        > results/forward-after-backward-whatif.txt

The premium is not fitted here. `forward_host.py` read it on 4 x H100
(`h100x4-forward-host/`): a GPT stage's forward issued with all four ranks busy took a
median 4.06 ms alone and 5.45 ms when each forward followed its backward (+34%). The stored
runs' GPT pipelines show the same order: per forward action, host time over what the
simulator charges was a median 1.11-1.14x in GPipe (forwards back to back), 1.30-1.35x in
1F1B and 1.40-1.53x in ZB-H1 over 25 runs. `plain` charges no premium; `after_b` charges
+34% on such forwards' ops (not on the runtime's own cost per action), in plans of two or
more stages (a one-GPU model's profile reads its forward after the previous pass's
backward already). The simulator has charged it since h100x4-run17, by the rule decided in
advance (`pipecast.simulate.simulator.FORWARD_AFTER_BACKWARD`).

Each line: a run, then per variant the median and worst |error| and the rows within 20%;
last, the totals and the signed median of the pipeline rows by schedule.
"""

from __future__ import annotations

import statistics
from typing import Any

from whatif import compare, totals

import pipecast.simulate.simulator as engine

ADOPTED = engine.FORWARD_AFTER_BACKWARD
PREMIUM = 0.34


def _use(premium: float) -> Any:
    def patch() -> None:
        engine.FORWARD_AFTER_BACKWARD = premium

    return patch


def main() -> None:
    runs = compare({"plain": _use(0.0), "after_b": _use(PREMIUM)}, _use(ADOPTED))
    for name, per_run in runs.items():
        by_schedule: dict[str, list[float]] = {}
        for cs in per_run:
            for c in cs:
                if " pipecast " in c.label and not c.graphed:
                    schedule = c.label.split(" pipecast ")[1].split()[0]
                    by_schedule.setdefault(schedule, []).append(c.error)
        signed = ", ".join(
            f"{s} {statistics.median(v):+.1%} ({len(v)})" for s, v in sorted(by_schedule.items())
        )
        print(f"{name}: {totals(per_run, runs['plain'])}; pipeline signed medians: {signed}")


if __name__ == "__main__":
    main()
