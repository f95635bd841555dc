"""Interleaved 1F1B with any count of virtual stages per rank (issue 67): its plans are
complete and run without deadlock, place stage s on rank s mod R, and leave Megatron's
bubble; the counts other schedules cannot run are refused."""

from __future__ import annotations

import pytest

from pipecast.errors import ConfigError
from pipecast.planning.schedules import make_plan, stages_per_rank
from pipecast.planning.simulation import Costs, simulate
from pipecast.values.plan import Action, Plan, validate

GRID = [(p, v, m) for p in (2, 3, 4) for v in (3, 4) for m in (p, 2 * p, 3 * p)]


def replay(plan: Plan) -> int:
    """Run every rank's actions in order, each once what it needs has run (F(s, j) after
    F(s-1, j); BW(s, j) after F(s, j) and BW(s+1, j)); the count of rounds, or an
    AssertionError where no rank can move (a deadlock) or an action is missing or doubled.
    Written apart from the validator, from the rule alone."""
    last = plan.num_stages - 1
    done: set[Action] = set()
    at = [0] * plan.num_ranks
    rounds = 0
    while any(at[r] < len(plan.actions[r]) for r in range(plan.num_ranks)):
        ready = []
        for r, actions in enumerate(plan.actions):
            if at[r] == len(actions):
                continue
            a = actions[at[r]]
            if a.kind == "F":
                needs = [Action(a.stage - 1, "F", a.mb)] if a.stage else []
            else:
                needs = [Action(a.stage, "F", a.mb)]
                needs += [Action(a.stage + 1, "BW", a.mb)] if a.stage < last else []
            if all(n in done for n in needs):
                ready.append((r, a))
        assert ready, f"deadlock at {[plan.actions[r][at[r]] for r in range(plan.num_ranks)]}"
        for r, a in ready:
            assert a not in done, f"{a} runs twice"
            done.add(a)
            at[r] += 1
        rounds += 1
    want = {
        Action(s, k, j)
        for s in range(plan.num_stages)
        for k in ("F", "BW")
        for j in range(plan.num_microbatches)
    }
    assert done == want, want ^ done
    return rounds


@pytest.mark.parametrize(("p", "v", "m"), GRID)
def test_plans_of_three_and_four_virtual_stages_are_complete_and_deadlock_free(
    p: int, v: int, m: int
) -> None:
    plan = make_plan("interleaved", p, m, virtual=v)
    validate(plan)
    assert plan.num_stages == p * v
    assert plan.stage_to_rank == tuple(s % p for s in range(p * v))
    for r, actions in enumerate(plan.actions):
        assert {a.stage for a in actions} == {r + k * p for k in range(v)}
    replay(plan)


@pytest.mark.parametrize(("p", "v", "m"), [*GRID, (8, 4, 32), (4, 2, 8)])
def test_bubble_is_megatrons_closed_form(p: int, v: int, m: int) -> None:
    """Narayanan et al. 2021, section 2.2.2: with every stage taking t_f + t_b, a rank runs
    m v stages' work and waits (p - 1)(t_f + t_b) in all, a bubble of (p - 1) / (v m) of the
    ideal step. The simulator's bubble_fraction is idle over idle + busy, so it must equal
    x / (1 + x) for x = (p - 1) / (v m)."""
    f, b = 1.0, 2.0
    t = simulate(make_plan("interleaved", p, m, virtual=v), Costs.uniform(p * v, f, b / 2, b / 2))
    assert t.step_time == pytest.approx((m * v + p - 1) * (f + b))
    x = (p - 1) / (v * m)
    assert t.bubble_fraction == pytest.approx(x / (1 + x))


def test_counts_a_schedule_cannot_run_are_refused() -> None:
    assert stages_per_rank("interleaved") == 2 and stages_per_rank("interleaved", 5) == 5
    assert stages_per_rank("zb-v") == stages_per_rank("zb-v", 2) == 2
    assert stages_per_rank("1f1b", 1) == 1
    with pytest.raises(ConfigError, match="at least 2 virtual stages per rank, got 1"):
        make_plan("interleaved", 2, 4, virtual=1)
    with pytest.raises(ConfigError, match=r"1f1b runs 1 stage\(s\) per rank, not 3 virtual stages"):
        make_plan("1f1b", 2, 4, virtual=3)
    with pytest.raises(ConfigError, match=r"zb-v runs 2 stage\(s\) per rank, not 4 virtual stages"):
        make_plan("zb-v", 2, 4, virtual=4)
    with pytest.raises(ConfigError, match=r"divisible by ranks \(4 % 3 = 1\): use 6"):
        make_plan("interleaved", 3, 4, virtual=4)
