"""RankMemory.tally works out an action's bytes once for its kind, stage and recomputation
(issue 67: a 405B search tallied millions of actions, each reading the same terms again).
The reference is the tally as written term by term, replayed beside it on every rank of
plans of each schedule under costs whose every memory term is non-zero, with transfer
buffers coming and going between the actions."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from pipecast.planning.schedules import make_plan
from pipecast.planning.simulation import Costs, StageTimes
from pipecast.planning.simulation.memory import (
    RankMemory,
    copies_under_way,
    held_bytes,
    host_bytes,
    recomputed,
)
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.weight_groups import weight_groups


class Reference(RankMemory):
    """The tally term by term, for every action (the batched W's path is shared)."""

    def tally(
        self,
        a: Action,
        st: StageTimes,
        costs: Costs,
        plan: Plan,
        issue: float,
        group: tuple[int, ...] | None = None,
    ) -> None:
        if group is not None:
            super().tally(a, st, costs, plan, issue, group)
            return
        self._drop_done(issue)
        scale = costs.graph_pool_ratio if costs.cuda_graphs else 1.0
        transient = int(st.workspace_bytes * scale) + self.in_flight_bytes
        held = int(held_bytes(a, st, costs, plan) * scale)
        if a.kind == "F":
            self.memory += held
        if a.kind != "W" and not plan.forward_only:
            transient += st.loss_bytes
        if a.kind in ("B", "BW"):
            transient += st.output_bytes + st.input_bytes
        hosted = host_bytes(a, st, costs, plan)
        offloaded = hosted > 0
        if a.kind in ("B", "BW") and recomputed(a.mb, costs, plan):
            transient += int((st.recomputed_bytes or st.activation_bytes) * scale)
            transient += st.restored_bytes if offloaded else 0
        elif a.kind in ("B", "BW") and offloaded:
            transient += st.restored_bytes or st.offloaded_bytes
        elif a.kind == "F" and offloaded:
            transient += copies_under_way(st)
        self.peak = max(self.peak, self.memory + transient)
        if offloaded:
            if a.kind == "F":
                self.host_memory += hosted
                self.host_peak = max(self.host_peak, self.host_memory)
            elif a.kind in ("W", "BW"):
                self.host_memory -= hosted
        if a.kind == "B":
            self.memory += int(st.held_bytes * scale)
        if a.kind == "W":
            self.memory -= held + int(st.held_bytes * scale)
        elif a.kind == "BW":
            self.memory -= held


def _stage(rng: random.Random, s: int, last: bool) -> StageTimes:
    def n(low: int, high: int) -> int:
        return rng.randrange(low, high)

    return StageTimes(
        forward=1.0, backward_input=1.0, backward_weight=1.0, backward=2.0,
        activation_bytes=n(500, 2000), input_bytes=n(10, 60) if s else 0,
        output_bytes=0 if last else n(10, 60), param_bytes=n(50, 90),
        workspace_bytes=n(1, 40), held_bytes=n(1, 30), gather_bytes=n(1, 9),
        loss_bytes=n(1, 70) if last else 0, restored_bytes=rng.choice([0, n(100, 400)]),
        recomputed_bytes=rng.choice([0, n(100, 900)]), checkpoint_bytes=rng.choice([0, n(60, 200)]),
        to_host=rng.choice([0.5, 1.5]), from_host=0.3,
    )  # fmt: skip


PLANS = [
    ("gpipe", 2, 4, 1),
    ("1f1b", 3, 6, 1),
    ("interleaved", 2, 4, 1),
    ("zb-h1", 3, 6, 1),
    ("zb-h1", 3, 6, 2),
    ("zb-v", 2, 6, 1),
    ("pipedream", 2, 4, 1),
    ("forward-only", 2, 3, 1),
]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("name", "ranks", "m", "wb"), PLANS)
def test_the_tally_is_the_term_by_term_tally(
    name: str, ranks: int, m: int, wb: int, seed: int
) -> None:
    rng = random.Random(seed)
    plan = make_plan(name, ranks, m, weight_batch=wb)
    stages = tuple(_stage(rng, s, s == plan.num_stages - 1) for s in range(plan.num_stages))
    groups = weight_groups(plan) if plan.weight_batch > 1 else {}
    for recompute in ("none", "all", "all-but-last"):
        for offload in ("none", "activations"):
            for graphed in (False, True):
                costs = Costs(
                    stages=stages, recompute=recompute, offload=offload,
                    cuda_graphs=graphed, graph_pool_ratio=1.3,
                )  # fmt: skip
                for r, actions in enumerate(plan.actions):
                    mem, ref = RankMemory(), Reference()
                    now = 0.0
                    for a in actions:
                        now += rng.uniform(0.0, 1.0)
                        st = costs.stages[a.stage]
                        mem.tally(a, st, costs, plan, now, groups.get(a))
                        ref.tally(a, st, costs, plan, now, groups.get(a))
                        if rng.random() < 0.5:  # a transfer buffer held past the action
                            size, until = rng.randrange(1, 50), now + rng.uniform(0.0, 2.0)
                            mem._hold(size, until)
                            ref._hold(size, until)
                        got = (mem.memory, mem.peak, mem.host_memory, mem.host_peak)
                        want = (ref.memory, ref.peak, ref.host_memory, ref.host_peak)
                        assert got == want, (r, a, recompute, offload, graphed)
                    assert mem.in_flight_bytes == ref.in_flight_bytes


def test_one_memory_under_other_costs_works_its_terms_out_again() -> None:
    """A RankMemory asked about other costs (or another plan) does not reuse the terms it
    worked out for the first."""
    plan = make_plan("gpipe", 1, 2)
    st = StageTimes(
        forward=1, backward_input=1, backward_weight=1, backward=2, activation_bytes=100
    )
    small = Costs(stages=(st,))
    large = replace(small, stages=(replace(small.stages[0], activation_bytes=1000),))
    mem = RankMemory()
    mem.tally(plan.actions[0][0], small.stages[0], small, plan, 0.0)
    assert mem.memory == 100
    mem.tally(plan.actions[0][1], large.stages[0], large, plan, 0.0)
    assert mem.memory == 1100
