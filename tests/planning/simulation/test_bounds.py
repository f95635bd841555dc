"""A step too big to simulate is refused before it is simulated (planning.simulation.bounds),
with a count of its actions that is the generated plan's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipecast.cli.main import main
from pipecast.errors import ConfigError
from pipecast.planning.schedules import SCHEDULES, make_plan
from pipecast.planning.simulation.bounds import MAX_ACTIONS, check_simulable, compute_actions

SHIPPED = str(
    Path(__file__).parents[3] / "src/pipecast/values/profile/shipped/h100/resnet50-imagenet.json"
)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_count_is_the_plans_own(schedule: str) -> None:
    for ranks, microbatches in ((1, 3), (2, 4), (4, 8)):
        plan = make_plan(schedule, ranks, microbatches)
        compute = [a for row in plan.actions for a in row if a.kind in ("F", "B", "W", "BW")]
        assert compute_actions(schedule, ranks, microbatches) == len(compute), (ranks, schedule)


def test_the_most_micro_batches_it_names_are_simulated() -> None:
    with pytest.raises(ConfigError, match=r"use at most (\d[\d,]*) micro-batches") as err:
        check_simulable("zb-h1", 2, 100_000)
    most = int(err.value.args[0].split("use at most ")[1].split(" ")[0].replace(",", ""))
    check_simulable("zb-h1", 2, most)  # no error
    assert compute_actions("zb-h1", 2, most + 1) > MAX_ACTIONS


def test_simulate_refuses_a_step_too_big_before_simulating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: 2 stages, 100,000 micro-batches (1F1B: F and BW of each)."""

    def simulated(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated")

    monkeypatch.setattr("pipecast.cli.simulate_verb.predict", simulated)
    monkeypatch.chdir(tmp_path)
    argv = ["simulate", "--profile", SHIPPED, "--stages", "2", "--micro-batches", "100000"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "1f1b step over 2 pipeline rank(s) and 100,000 micro-batches holds 400,000" in err
    assert f"more than the {MAX_ACTIONS:,} pipecast simulates" in err
    assert len(err.splitlines()) == 1 and not list(tmp_path.iterdir()), err
