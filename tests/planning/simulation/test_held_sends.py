"""The simulator's opt-in what-if terms for compute held behind sends (Costs.launch_queue,
Costs.hold_sends): off, nothing changes; on, a send waits for its receiver's host."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipecast.errors import ConfigError
from pipecast.planning.schedules.generators import make_plan
from pipecast.planning.simulation.costs import Costs, StageTimes
from pipecast.planning.simulation.simulator import simulate

FAST = StageTimes(forward=1.0, backward_input=1.0, backward_weight=0.0, backward=1.0)
# the receiving stage's host takes 3 s to issue a forward: it reaches its second forward
# (and posts that forward's receive) at t=3, a second after the sender finished it
SLOW_HOST = replace(FAST, host_forward=3.0)


def _events(hold: bool) -> dict[str, tuple[float, float]]:
    plan = make_plan("gpipe", 2, 2)
    costs = Costs(stages=(FAST, SLOW_HOST), forward_transfer=(0.5,), backward_transfer=(0.5,))
    timeline = simulate(plan, replace(costs, hold_sends=hold))
    return {e.name: (e.start, e.end) for e in timeline.events}


def test_a_held_send_begins_when_its_receiver_posts_the_receive() -> None:
    free, held = _events(False), _events(True)
    assert free["send 0F1"] == pytest.approx((2.0, 2.5))  # leaves when its data is ready
    assert held["send 0F1"] == pytest.approx((3.0, 3.5))  # waits for the receiver's host
    assert held["1F1"][0] == pytest.approx(3.5)
    assert held["send 0F0"] == free["send 0F0"]  # its receive was posted at once


def test_the_what_if_terms_change_nothing_when_off_and_never_speed_a_step_up() -> None:
    host_bound = replace(
        FAST, backward_weight=0.5, host_forward=1.5, host_backward=2.0, host_backward_input=1.2
    )
    for schedule in ("gpipe", "1f1b", "zb-h1"):
        plan = make_plan(schedule, 4, 8)
        costs = Costs(
            stages=(host_bound,) * 4, forward_transfer=(0.1,) * 3, backward_transfer=(0.1,) * 3
        )
        plain = simulate(plan, costs)
        # a launch queue longer than any rank's actions never fills: nothing changes
        roomy = simulate(plan, replace(costs, launch_queue=len(plan.actions[0]) + 1))
        assert roomy.step_time == pytest.approx(plain.step_time) and roomy.events == plain.events
        for queue in (1, 2):
            held = simulate(plan, replace(costs, launch_queue=queue, hold_sends=True))
            assert held.step_time >= plain.step_time - 1e-9


def test_the_strict_hold_can_leave_an_interleaved_plan_stuck() -> None:
    """A rank holding two stages waits on a receive that waits on it: the strict hold
    reports the plan as unable to finish (real runs have several hardware queues)."""
    plan = make_plan("interleaved", 4, 8)
    host_bound = replace(FAST, host_forward=1.5, host_backward=2.0)
    costs = Costs(
        stages=(host_bound,) * plan.num_stages,
        forward_transfer=(0.1,) * (plan.num_stages - 1),
        backward_transfer=(0.1,) * (plan.num_stages - 1),
        hold_sends=True,
    )
    with pytest.raises(ConfigError, match="cannot finish"):
        simulate(plan, costs)
