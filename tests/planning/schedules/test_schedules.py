from __future__ import annotations

import pytest

from pipecast.errors import ConfigError, PlanError, UnknownNameError
from pipecast.planning.schedules import SCHEDULES, make_plan
from pipecast.planning.schedules.generators import gpipe, interleaved_1f1b, one_f_one_b
from pipecast.values.plan import Action, Plan, validate


def actions(plan: Plan, rank: int) -> str:
    return " ".join(str(a) for a in plan.actions[rank])


def test_action_text_round_trips() -> None:
    for text in ("0F3", "2B1", "2W1", "11BW0"):
        assert str(Action.parse(text)) == text
    with pytest.raises(PlanError, match="not an action"):
        Action.parse("F3")


def test_gpipe_literal() -> None:
    p = gpipe(2, 3)
    assert actions(p, 0) == "0F0 0F1 0F2 0BW0 0BW1 0BW2"
    assert actions(p, 1) == "1F0 1F1 1F2 1BW0 1BW1 1BW2"


def test_1f1b_literal() -> None:
    p = one_f_one_b(3, 4)
    assert actions(p, 0) == "0F0 0F1 0F2 0BW0 0F3 0BW1 0BW2 0BW3"
    assert actions(p, 1) == "1F0 1F1 1BW0 1F2 1BW1 1F3 1BW2 1BW3"
    assert actions(p, 2) == "2F0 2BW0 2F1 2BW1 2F2 2BW2 2F3 2BW3"


def test_interleaved_literal() -> None:
    p = interleaved_1f1b(2, 4, chunks=2)
    assert p.stage_to_rank == (0, 1, 0, 1)
    assert (
        actions(p, 0) == "0F0 0F1 2F0 2F1 0F2 2BW0 0F3 2BW1 2F2 0BW0 2F3 0BW1 2BW2 2BW3 0BW2 0BW3"
    )


def test_zb_h1_defers_w_by_stage() -> None:
    p = make_plan("zb-h1", 3, 4)
    assert p.split_backward
    assert actions(p, 0) == "0F0 0F1 0F2 0B0 0W0 0F3 0B1 0W1 0B2 0W2 0B3 0W3"
    assert actions(p, 2) == "2F0 2B0 2F1 2B1 2F2 2B2 2W0 2F3 2B3 2W1 2W2 2W3"


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize(("ranks", "m"), [(1, 1), (2, 4), (4, 8), (4, 12), (8, 16)])
def test_every_generator_validates(name: str, ranks: int, m: int) -> None:
    plan = make_plan(name, ranks, m)
    validate(plan)
    assert Plan.from_text(plan.to_text()) == plan
    assert Plan.from_json(plan.to_json()) == plan


def test_validator_catches_missing_and_misordered_and_deadlock() -> None:
    good = one_f_one_b(2, 2)
    missing = Plan(**{**good.__dict__, "actions": (good.actions[0][:-1], good.actions[1])})
    with pytest.raises(PlanError, match="incomplete: missing 0BW1"):
        validate(missing)
    swapped = (good.actions[0], (good.actions[1][1], good.actions[1][0], *good.actions[1][2:]))
    with pytest.raises(PlanError, match="1BW0 comes before 1F0"):
        validate(Plan(**{**good.__dict__, "actions": swapped}))
    r0 = tuple(Action.parse(t) for t in ["0F0", "0BW0", "0BW1", "0F1"])
    with pytest.raises(PlanError, match="0BW1 comes before 0F1"):
        validate(Plan(**{**good.__dict__, "actions": (r0, good.actions[1])}))
    # rank 1 wants 1F1 (needs 0F1) first; rank 0 sends 0F1 only after 0BW0, which needs 1BW0
    deadlock0 = tuple(Action.parse(t) for t in ["0F0", "0BW0", "0F1", "0BW1"])
    deadlock1 = tuple(Action.parse(t) for t in ["1F1", "1F0", "1BW0", "1BW1"])
    with pytest.raises(PlanError, match="deadlocks") as err:
        validate(Plan(**{**good.__dict__, "actions": (deadlock0, deadlock1)}))
    assert "[0BW0]" in str(err.value) and "[1F1]" in str(err.value)  # the grid marks both


def test_bad_schedule_inputs() -> None:
    with pytest.raises(UnknownNameError, match="choose one of 1f1b"):
        make_plan("dualpipe", 4, 8)
    with pytest.raises(ConfigError, match="divisible by ranks"):
        make_plan("interleaved", 4, 6)
    with pytest.raises(ConfigError, match="at least 1 micro-batch"):
        make_plan("gpipe", 4, 0)
