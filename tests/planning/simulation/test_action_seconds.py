"""The simulator prices each kind of action once per simulation (its host, device and span
seconds kept by kind, stage, whether it recomputes, whether a backward precedes it on its
rank and how many micro-batches a batched W computes): every action must still take what
its own pricing gives it, where recomputation depends on the micro-batch ('all-but-last')
and a batched W computes its whole group or nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipecast.planning.schedules import make_plan
from pipecast.planning.simulation import Costs, StageTimes, simulate
from pipecast.planning.simulation.simulator import _duration, _host
from pipecast.values.plan.action import Plan
from pipecast.values.plan.weight_groups import weight_groups

ONE_RANK = """plan hand stages=1 microbatches=2 placement=0 flags=split weight-batch=2
rank 0: 0F0 0B0 0F1 0B1 0W0 0W1"""


def test_one_rank_by_hand() -> None:
    """F 1, B 2, a lone W 3, the group of two as one W 5; 'all-but-last': micro-batch 0's B
    runs its forward again (3), micro-batch 1's does not (2); W0 computes nothing, W1 the
    group (5). 1 + 3 + 1 + 2 + 0 + 5 = 12 s, the device never idle."""
    st = StageTimes(
        forward=1.0, backward_input=2.0, backward_weight=3.0, backward=5.0, weight_group=5.0
    )
    t = simulate(Plan.from_text(ONE_RANK), Costs(stages=(st,), recompute="all-but-last"))
    assert t.step_time == pytest.approx(12.0)
    took = {e.name: e.end - e.start for e in t.events if e.kind in ("F", "B", "W")}
    assert took == pytest.approx({"0F0": 1, "0B0": 3, "0F1": 1, "0B1": 2, "0W0": 0, "0W1": 5})


def _stage(s: int, host: bool) -> StageTimes:
    """Stage `s`: seconds that differ from stage to stage (the stage is part of what an
    action's price depends on), a batched W's group priced apart, activations copied to the
    host and back; with `host`, the host's seconds to issue each kind."""
    return StageTimes(
        forward=1.0 + 0.25 * s, backward_input=1.5 + 0.25 * s, backward_weight=1.25,
        backward=2.75 + 0.25 * s, weight_group=2.0 + 0.5 * s, activation_bytes=100,
        input_bytes=10, to_host=1.75, from_host=0.5, host_forward=0.5 * host,
        host_backward_input=0.75 * host, host_backward_weight=0.25 * host, host_backward=host,
    )  # fmt: skip


def _costs(plan: Plan, host: bool, **extra: object) -> Costs:
    """`plan`'s stages (_stage), recomputed all but the last micro-batch."""
    stages = tuple(_stage(s, host) for s in range(plan.num_stages))
    return Costs(stages=stages, recompute="all-but-last", **extra)  # type: ignore[arg-type]


PLANS = [("zb-h1", 4, 8, 2), ("zb-v", 2, 6, 2), ("1f1b", 3, 6, 1), ("interleaved", 2, 4, 1)]
"""(schedule, ranks, micro-batches, weight batch)."""


@pytest.mark.parametrize("offload", ["none", "activations"])
@pytest.mark.parametrize(("name", "ranks", "m", "wb"), PLANS)
def test_each_action_takes_its_own_device_seconds(
    name: str, ranks: int, m: int, wb: int, offload: str
) -> None:
    """With a host that costs nothing (and no span), each action runs from its start for
    exactly its own device seconds, priced action by action."""
    plan = make_plan(name, ranks, m, weight_batch=wb)
    costs = _costs(plan, host=False, offload=offload)
    groups = weight_groups(plan) if plan.weight_batch > 1 else {}
    t = simulate(plan, costs, exposed=False)
    actions = {str(a): a for rank in plan.actions for a in rank}
    ran = [e for e in t.events if e.kind in ("F", "B", "W", "BW")]
    assert len(ran) == len(actions)
    for e in ran:
        a = actions[e.name]
        own = _duration(a, costs.stages[a.stage], costs, plan, groups.get(a))
        assert e.end - e.start == pytest.approx(own), e.name


@pytest.mark.parametrize(("name", "ranks", "m", "wb"), PLANS)
def test_each_rank_issues_for_its_actions_own_host_seconds(
    name: str, ranks: int, m: int, wb: int
) -> None:
    """Each rank's host is busy for the sum of its actions' own host seconds, each priced
    with what precedes it on the rank (a forward after a backward costs more)."""
    plan = make_plan(name, ranks, m, weight_batch=wb)
    costs = _costs(plan, host=True)
    groups = weight_groups(plan) if plan.weight_batch > 1 else {}
    t = simulate(plan, costs, exposed=False)
    for r, actions in enumerate(plan.actions):
        own = sum(
            _host(a, costs.stages[a.stage], costs, plan, i > 0 and actions[i - 1].kind != "F",
                  groups.get(a))
            for i, a in enumerate(actions)
        )  # fmt: skip
        assert t.host_busy[r] == pytest.approx(own)


def test_a_forward_after_a_backward_pays_its_premium_only_there() -> None:
    """1F1B, 2 ranks, 4 micro-batches, host-bound (host 1 s a forward, device nothing):
    rank 0 issues 0F0 0F1 then 0B0 0F2 0B1 0F3 0B2 0B3, two forwards after a backward;
    each of those pays FORWARD_AFTER_BACKWARD (0.34) more: 4 x 1 + 2 x 0.34 + the
    backwards' 4 x 1 = 8.68 s of host."""
    st = replace(
        StageTimes(forward=0, backward_input=0, backward_weight=0, backward=0),
        host_forward=1.0, host_backward=1.0,
    )  # fmt: skip
    plan = make_plan("1f1b", 2, 4)
    assert [str(a) for a in plan.actions[0]] == [
        "0F0", "0F1", "0BW0", "0F2", "0BW1", "0F3", "0BW2", "0BW3"
    ]  # fmt: skip
    t = simulate(plan, Costs(stages=(st, st)), exposed=False)
    assert t.host_busy[0] == pytest.approx(8.68)
