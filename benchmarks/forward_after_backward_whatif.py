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
1F1B and 1.40-1.53x in ZB-H1 over 25 runs. `plain` is the simulator; `after_b` charges
+34% on such forwards' ops (not on the runtime's own cost per action), in plans of two or
more stages (a one-GPU model's profile reads its forward after the previous pass's
backward already).

Each line: a run, then per variant the median and worst |error| and the rows within 20%;
last, the totals and the signed median of the pipeline rows by schedule.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from whatif import compare, totals

import pipecast.simulate.engine as engine
from pipecast.schedule.action import Action, Plan

PLAIN = engine._host
PREMIUM = 0.34
_after: dict[int, tuple[Plan, set[Action]]] = {}
"""id(plan) -> (the plan, kept so its id is not reused; its forwards after a backward)."""


def _after_backward(plan: Plan) -> set[Action]:
    """The forwards of `plan` that directly follow a backward action on their rank."""
    kept = _after.get(id(plan))
    if kept is None or kept[0] is not plan:
        kept = _after[id(plan)] = (
            plan,
            {
                a
                for actions in plan.actions
                for prev, a in itertools.pairwise(actions)
                if a.kind == "F" and prev.kind in ("B", "W", "BW")
            },
        )
    return kept[1]


def _premium(action: Action, st: Any, costs: Any, plan: Plan) -> float:
    seconds: float = PLAIN(action, st, costs, plan)
    if plan.num_stages > 1 and not costs.cuda_graphs and action in _after_backward(plan):
        seconds += PREMIUM * st.host_forward
    return seconds


def _use(fn: Any) -> Any:
    def patch() -> None:
        _after.clear()
        engine._host = fn

    return patch


def main() -> None:
    runs = compare({"plain": _use(PLAIN), "after_b": _use(_premium)}, _use(PLAIN))
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
