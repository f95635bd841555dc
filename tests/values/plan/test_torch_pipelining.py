"""pipecast's split and schedule as torch.distributed.pipelining reads them."""

from __future__ import annotations

import pytest
import torch
from tests import user_models

from pipecast.errors import ConfigError
from pipecast.planning.schedules import make_plan
from pipecast.values.data.registry import get_spec
from pipecast.values.models.capture import capture
from pipecast.values.plan.torch_pipelining import (
    schedule_csv,
    split_points,
    split_script,
    why_not_exported,
)

IMAGES = get_spec("mnist")


def test_the_schedule_rows_parse_as_torch_actions() -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    plan = make_plan("zb-h1", 2, 4)
    rows = schedule_csv(plan).splitlines()
    assert len(rows) == 2
    for acts, row in zip(plan.actions, rows, strict=True):
        parsed = [schedules._Action.from_str(t) for t in row.split(",")]
        assert [(a.stage_index, a.microbatch_index) for a in parsed] == [
            (a.stage, a.mb) for a in acts
        ]
        kinds = {
            "F": "FORWARD",
            "B": "BACKWARD_INPUT",
            "W": "BACKWARD_WEIGHT",
            "BW": "FULL_BACKWARD",
        }
        assert [a.computation_type.name for a in parsed] == [kinds[a.kind] for a in acts]


def test_split_points_cut_torch_pipe_where_pipecast_does() -> None:
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    torch.manual_seed(0)
    module = user_models.residual_net(IMAGES)
    blocks = capture(module, IMAGES, name="net")
    begins = [b.begins for b in blocks]
    assert begins == ["", "stages.0", "stages.1", "stages.2", "stages.3", "head"]
    points = split_points(begins, [0, 2, 4, 6])
    assert points == ["stages.1", "stages.3"]
    spec = {p: pipelining.SplitPoint.BEGINNING for p in points}
    x = torch.randn(2, *IMAGES.sample_shape)
    pipe = pipelining.pipeline(module, mb_args=(x,), split_spec=spec)
    assert pipe.num_stages == 3
    script = split_script("net", points, make_plan("1f1b", 3, 4), "net.csv")
    assert "'stages.1': SplitPoint.BEGINNING" in script


def test_a_block_inside_a_module_has_no_split_point() -> None:
    with pytest.raises(ConfigError, match="block 1"):
        split_points(["", "", "x"], [0, 1, 3])


def _torch_validates(csv: str, plan_ranks: int, stages: int, microbatches: int) -> None:
    """torch's own check of a loaded CSV (what PipelineScheduleMulti._load_csv runs)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    actions = {
        rank: [schedules._Action.from_str(t) for t in row.split(",")]
        for rank, row in enumerate(csv.splitlines())
    }
    schedules._validate_schedule(actions, plan_ranks, stages, microbatches)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "interleaved", "zb-v"])
def test_training_schedules_load_in_torch(name: str) -> None:
    plan = make_plan(name, 2, 4)
    _torch_validates(schedule_csv(plan), plan.num_ranks, plan.num_stages, 4)


def test_a_forward_only_plan_is_refused_as_torch_would_refuse_it() -> None:
    plan = make_plan("forward-only", 2, 4)
    rows = "".join(",".join(f"{a.stage}F{a.mb}" for a in acts) + "\n" for acts in plan.actions)
    with pytest.raises(AssertionError, match="backward"):  # torch's loader: no backwards
        _torch_validates(rows, plan.num_ranks, plan.num_stages, 4)
    assert why_not_exported(plan) is not None
    with pytest.raises(ConfigError, match="--export torch: forward-only has no backward"):
        schedule_csv(plan)


def test_a_pipedream_plan_is_refused_since_torch_would_run_it_as_1f1b() -> None:
    """PipeDream's actions are 1F1B's; only its updates after every micro-batch differ, and
    a CSV has no place for them."""
    pipedream, one_f_one_b = make_plan("pipedream", 2, 4), make_plan("1f1b", 2, 4)
    assert pipedream.actions == one_f_one_b.actions and pipedream.async_updates
    with pytest.raises(ConfigError, match="updates the weights after every micro-batch"):
        schedule_csv(pipedream)
    assert why_not_exported(one_f_one_b) is None
