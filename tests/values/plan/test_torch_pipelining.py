"""pipecast's split and schedule as torch.distributed.pipelining reads them."""

from __future__ import annotations

import pytest
import torch
from tests import user_models

from pipecast.errors import ConfigError
from pipecast.planning.schedules import make_plan
from pipecast.values.data.registry import get_spec
from pipecast.values.models.capture import capture
from pipecast.values.plan.torch_pipelining import schedule_csv, split_points, split_script

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
