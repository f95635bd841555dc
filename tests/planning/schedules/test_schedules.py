from __future__ import annotations

import pytest

from pipecast.errors import ConfigError, PlanError, UnknownNameError
from pipecast.planning.schedules import SCHEDULES, make_plan
from pipecast.planning.schedules.generators import (
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zero_bubble_v,
)
from pipecast.values.plan import Action, Plan, unit_clock, validate


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


def test_zb_v_literal_two_ranks() -> None:
    """The Zero Bubble paper's V order for 2 ranks and 4 micro-batches, written out by hand
    from its rules (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2)."""
    p = zero_bubble_v(2, 4)
    assert p.stage_to_rank == (0, 1, 1, 0)
    assert actions(p, 0) == (
        "0F0 0F1 0F2 3F0 3B0 3W0 3F1 3B1 3W1 0F3 0B0 0W0 3F2 3B2 3W2 0B1 0W1 3F3 3B3 3W3 "
        "0B2 0W2 0B3 0W3"
    )
    assert actions(p, 1) == (
        "1F0 2F0 1F1 2F1 2B0 2W0 1F2 1B0 1W0 2F2 2B1 2W1 1F3 1B1 1W1 2F3 2B2 2W2 1B2 2B3 "
        "1B3 1W2 2W3 1W3"
    )


def test_zb_v_literal_four_ranks() -> None:
    """The V order for 4 ranks and 8 micro-batches: the first rank (stages 0 and 7) and the
    last (stages 3 and 4), by hand."""
    p = zero_bubble_v(4, 8)
    assert actions(p, 0) == (
        "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7B0 7W0 7F1 7B1 7W1 7F2 7B2 7W2 7F3 7B3 7W3 0F7 "
        "0B0 0W0 7F4 7B4 7W4 0B1 0W1 7F5 7B5 7W5 0B2 0W2 7F6 7B6 7W6 0B3 0W3 7F7 7B7 7W7 "
        "0B4 0W4 0B5 0W5 0B6 0W6 0B7 0W7"
    )
    assert actions(p, 3) == (
        "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4B0 4W0 3F4 3B0 3W0 4F4 4B1 4W1 3F5 3B1 3W1 4F5 "
        "4B2 4W2 3F6 3B2 3W2 4F6 4B3 4W3 3F7 3B3 3W3 4F7 4B4 4W4 3B4 4B5 3B5 4B6 3B6 4B7 "
        "3B7 3W4 4W5 4W6 4W7 3W5 3W6 3W7"
    )


@pytest.mark.parametrize(("ranks", "m"), [(2, 3), (2, 8), (4, 7), (4, 16), (8, 15)])
def test_zb_v_leaves_no_idle_slot_inside_a_ranks_span(ranks: int, m: int) -> None:
    """On the unit clock (F = B = W) every rank runs from its first action to its last
    without a gap, once M >= 2R-1, and keeps at most 2R chunk micro-batches in flight."""
    p = zero_bubble_v(ranks, m)
    clock = unit_clock(p)
    for r in range(ranks):
        spans = sorted(clock[a] for a in p.actions[r])
        assert spans[-1][1] - spans[0][0] == len(spans)
        in_flight = peak = 0
        for a in p.actions[r]:
            in_flight += {"F": 1, "B": 0, "W": -1}[a.kind]
            peak = max(peak, in_flight)
        assert peak <= 2 * ranks


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


def test_a_weight_batch_fits_the_plans_micro_batches_and_a_split_backward() -> None:
    """ZB-H1 over 4 micro-batches groups its Ws by 1 to 4 (4: all of them as one); 0 or 5
    is refused naming the range, and a weight batch on a schedule without W by naming the
    ones that have it."""
    assert make_plan("zb-h1", 2, 4, weight_batch=4).weight_batch == 4
    for k in (0, 5, 100):
        with pytest.raises(PlanError, match=f"weight batch of {k} .* choose 1 to 4$"):
            make_plan("zb-h1", 2, 4, weight_batch=k)
    with pytest.raises(PlanError, match=r"1f1b does not run: use zb-h1, zb-v or zb-auto$"):
        make_plan("1f1b", 2, 4, weight_batch=2)
