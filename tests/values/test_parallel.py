"""The one order of a job's ranks, against the numbering of a mesh read row-major (what
init_device_mesh does: torch.arange(world).view(shape)) and the schedules' own placement."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipecast.errors import ConfigError
from pipecast.planning.schedules.generators import make_plan
from pipecast.values.parallel import Layout, Place

LAYOUTS = [
    Layout(),
    Layout(replicas=2, pipeline=2, tensor=8),
    Layout(replicas=4, fsdp=2, pipeline=3, context=2, tensor=2),
    Layout(replicas=6, fsdp=3, tensor=4),
    Layout(replicas=3, pipeline=5),
    Layout(pipeline=2, virtual=2, placement="loop", context=3, tensor=2),
]


def _grid(layout: Layout) -> np.ndarray:
    """Every rank at its place, as init_device_mesh numbers a mesh of the layout's shape."""
    return np.arange(layout.world).reshape(layout.shape)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_ranks_are_the_mesh_read_row_major(layout: Layout) -> None:
    grid = _grid(layout)
    for place in itertools.product(*map(range, layout.shape)):
        rank = layout.rank_of(Place(*place))
        assert rank == grid[place]
        assert layout.place(rank) == place


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_without_context_ranks_keep_the_runtimes_numbering(layout: Layout) -> None:
    """(replica x pipeline ranks + pipeline rank) x tp + t: how the runtime numbered its
    processes before the layout had a home, which a run must keep."""
    if layout.context != 1:
        return
    for k, r, t in itertools.product(
        range(layout.replicas), range(layout.pipeline), range(layout.tensor)
    ):
        expected = (k * layout.pipeline + r) * layout.tensor + t
        assert layout.rank(replica=k, pipeline=r, tensor=t) == expected


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_a_group_is_the_mesh_sliced_along_its_axis(layout: Layout) -> None:
    grid = _grid(layout)
    # the data axis split in two, copies outermost: (replicate, fsdp, pipeline, ...)
    split = grid.reshape(layout.replicate, layout.fsdp, *layout.shape[1:])
    for rank in range(layout.world):
        at = layout.place(rank)
        copy, shard = divmod(at.replica, layout.fsdp)
        rest = (at.pipeline, at.context, at.tensor)
        slices = {
            "data": grid[:, at.pipeline, at.context, at.tensor],
            "pipeline": grid[at.replica, :, at.context, at.tensor],
            "context": grid[at.replica, at.pipeline, :, at.tensor],
            "tensor": grid[at.replica, at.pipeline, at.context, :],
            "fsdp": split[(copy, slice(None), *rest)],
            "replicate": split[(slice(None), shard, *rest)],
        }
        for axis, expected in slices.items():
            assert layout.group(axis, rank) == tuple(expected), (axis, rank)  # type: ignore[arg-type]


def test_the_named_groups_of_a_place() -> None:
    """TP x8 on 2 replicas of 2 pipeline ranks: by hand."""
    layout = Layout(replicas=2, pipeline=2, tensor=8)
    assert layout.replica_group(pipeline=1, tensor=3) == (11, 27)
    assert layout.pipeline_group(replica=1, tensor=3) == (19, 27)
    assert layout.tensor_group(replica=1, pipeline=0) == tuple(range(16, 24))


@pytest.mark.parametrize(
    ("schedule", "placement", "ranks", "stages"),
    [("1f1b", "one", 4, 4), ("interleaved", "loop", 4, 8), ("zb-v", "v", 4, 8)],
)
def test_stages_sit_where_the_schedules_put_them(
    schedule: str, placement: str, ranks: int, stages: int
) -> None:
    plan = make_plan(schedule, ranks, 8)
    assert plan.num_stages == stages
    layout = Layout(
        replicas=2,
        pipeline=ranks,
        virtual=stages // ranks,
        placement=placement,  # type: ignore[arg-type]
        tensor=2,
    )
    assert tuple(layout.stage_rank(s) for s in range(stages)) == plan.stage_to_rank
    for s in range(stages):
        r = plan.stage_to_rank[s]
        assert layout.stage_ranks(s) == (r * 2, (ranks + r) * 2)


@pytest.mark.parametrize(
    ("degrees", "words"),
    [
        ({"tensor": 0}, "at least 1"),
        ({"replicas": 4, "fsdp": 3}, "do not split into FSDP groups of 3"),
        ({"pipeline": 2, "virtual": 2}, "placement of several per rank"),
    ],
)
def test_a_layout_that_cannot_be_is_refused(degrees: dict[str, int], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Layout(**degrees)  # type: ignore[arg-type]


def test_a_place_outside_the_layout_is_refused() -> None:
    layout = Layout(replicas=2, tensor=2)
    with pytest.raises(ConfigError, match="tensor 2 is outside"):
        layout.rank(tensor=2)
    with pytest.raises(ConfigError, match="rank 4 is outside"):
        layout.place(4)
    with pytest.raises(ConfigError, match="stage 1 is outside"):
        layout.stage_rank(1)
