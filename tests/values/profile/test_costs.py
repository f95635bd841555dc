"""Profile arithmetic that needs no measurement: stage sums, monotone sizes, backward peaks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile
from tests.values.profile.helpers import shipped_profile

from pipecast.values.profile.interpolate import monotone
from pipecast.values.profile.types import BlockCost, Profile


def with_costs(profile: Profile, costs: list[dict[int, BlockCost]]) -> Profile:
    return replace(
        profile,
        blocks=tuple(replace(b, costs=c) for b, c in zip(profile.blocks, costs, strict=True)),
        micro_batch_sizes=tuple(sorted(costs[0])),
    )


def test_monotone_caps_each_size_by_every_larger_one() -> None:
    assert monotone([7.0, 19.8, 11.5, 21.7]) == [7.0, 11.5, 11.5, 21.7]
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]


def test_a_small_micro_batch_never_costs_more_than_a_larger_one() -> None:
    """A 32 measured slower than the 64 beside it (one-sided noise) is read as the 64's time;
    sizes in between interpolate through the capped values."""
    base = make_profile([1.0])
    c = base.blocks[0].costs[8]
    noisy = with_costs(
        base,
        [
            {
                16: replace(c, forward=7.0, host_forward=1.0),
                32: replace(c, forward=19.8, host_forward=3.0),
                64: replace(c, forward=11.5, host_forward=2.0),
            }
        ],
    )
    assert noisy.cost(0, 32).forward == pytest.approx(11.5)
    # the host issues the same ops at any size: the smallest size's reading is its own (a
    # larger size reads dearer when the device's backlog held the host back)
    assert noisy.cost(0, 32).host_forward == pytest.approx(1.0)
    assert noisy.cost(0, 128).host_forward == pytest.approx(1.0)
    # and cheaper when the host ran a fast spell: still the smallest size's
    fast = with_costs(base, [{16: replace(c, host_forward=2.0), 64: replace(c, host_forward=1.0)}])
    assert fast.cost(0, 64).host_forward == pytest.approx(2.0)
    assert noisy.cost(0, 16).forward == pytest.approx(7.0)
    assert noisy.cost(0, 24).forward == pytest.approx((7.0 + 11.5) / 2)
    assert noisy.cost(0, 64).forward == pytest.approx(11.5)


def test_backward_peak_counts_only_activations_not_yet_freed() -> None:
    """Block 0 needs 500 transient bytes in its backward, but by then blocks 1 and 2 have
    freed their 300 saved bytes: the stage needs 200 beyond all its activations. Alone, block
    0 needs all 500."""
    base = make_profile([1.0] * 3, saved=[100, 100, 200])
    costs = [dict(b.costs) for b in base.blocks]
    costs[0][8] = replace(costs[0][8], peak_bytes=500)
    costs[2][8] = replace(costs[2][8], peak_bytes=50)
    p = with_costs(base, costs)
    assert p.stage(0, 3, 8).peak_bytes == 500 - 300
    assert p.stage(0, 1, 8).peak_bytes == 500
    assert p.stage(1, 3, 8).peak_bytes == 50
    assert p.stage(0, 3, 8).activation_bytes == 400


def test_a_stage_pays_the_optimizers_fixed_cost_once() -> None:
    base = make_profile([1.0] * 3)
    p = replace(
        base,
        blocks=tuple(replace(b, optimizer_step=0.25) for b in base.blocks),
        optimizer_fixed=1.0,
    )
    assert p.stage(0, 3, 8).optimizer_step == pytest.approx(1.0 + 3 * 0.25)
    assert p.stage(1, 2, 8).optimizer_step == pytest.approx(1.0 + 0.25)
    assert Profile.from_json(p.to_json()).optimizer_fixed == 1.0


def test_a_stage_pays_one_split_backward_call_not_one_per_block() -> None:
    """Each block's B host time was timed in a call of its own (call + its own work); a
    stage's B is one call over all its blocks: four blocks of 0.25 with a 0.2 call cost
    0.2 + 4 x 0.05. The call is the least a B can cost; W and BW are untouched."""
    base = make_profile([1.0] * 4)
    costs = [
        {mb: replace(c, host_backward_input=0.25, host_backward_weight=0.5, host_backward=0.3)}
        for b in base.blocks
        for mb, c in b.costs.items()
    ]
    alone = with_costs(base, costs)
    p = replace(alone, host=replace(alone.host, split_call=0.2))
    assert alone.stage(0, 4, 8).host_backward_input == pytest.approx(1.0)
    assert p.stage(0, 4, 8).host_backward_input == pytest.approx(0.2 + 4 * 0.05)
    assert p.stage(1, 2, 8).host_backward_input == pytest.approx(0.25)
    assert p.stage(0, 4, 8).host_backward_weight == pytest.approx(2.0)
    assert p.stage(0, 4, 8).host_backward == pytest.approx(1.2)
    assert (
        replace(p, host=replace(p.host, split_call=0.4)).stage(0, 4, 8).host_backward_input == 0.4
    )
    assert Profile.from_json(p.to_json()).host.split_call == 0.2


def test_a_stage_pays_one_split_backward_call_per_segment() -> None:
    """Blocks of 8 weight tensors each close a segment (pipecast.values.profile.segments): the
    runtime cuts such a stage into one graph per block, so its B makes a call per block and the
    isolated sum is what it costs; weightless blocks between them share their segment's call."""
    base = make_profile([1.0] * 4)
    costs = [
        {mb: replace(c, host_backward_input=0.25)} for b in base.blocks for mb, c in b.costs.items()
    ]
    p = with_costs(base, costs)
    p = replace(p, host=replace(p.host, split_call=0.2))
    heavy = replace(p, blocks=tuple(replace(b, param_tensors=8) for b in p.blocks))
    assert heavy.stage(0, 4, 8).host_backward_input == pytest.approx(1.0)
    mixed = replace(
        p,
        blocks=tuple(
            replace(b, param_tensors=n) for b, n in zip(p.blocks, (8, 0, 8, 0), strict=True)
        ),
    )
    assert mixed.stage(0, 4, 8).host_backward_input == pytest.approx(2 * 0.2 + 4 * 0.05)
    assert mixed.stage(1, 4, 8).host_backward_input == pytest.approx(0.2 + 3 * 0.05)


def test_a_stage_keeps_the_largest_library_workspace_of_its_blocks() -> None:
    """cuBLAS's workspaces are one per stream, shared by every call on it: a stage keeps the
    most any of its blocks keeps, and none where its blocks call no cuBLAS. A profile whose
    blocks were not measured charges every stage its floor, as before; the JSON keeps the
    difference between 0 and not measured."""
    base = replace(make_profile([1.0] * 3), floor_bytes=64)
    measured = replace(
        base,
        blocks=tuple(
            replace(b, kept_workspace=k) for b, k in zip(base.blocks, [0, 64, 32], strict=True)
        ),
    )
    assert measured.stage(0, 1, 8).kept_workspace == 0
    assert measured.stage(0, 2, 8).kept_workspace == 64
    assert measured.stage(1, 3, 8).kept_workspace == 64
    assert measured.stage(2, 3, 8).kept_workspace == 32
    assert base.stage(0, 1, 8).kept_workspace == 64
    again = Profile.from_json(measured.to_json())
    assert [b.kept_workspace for b in again.blocks] == [0, 64, 32]
    assert [b.kept_workspace for b in Profile.from_json(base.to_json()).blocks] == [None] * 3


def test_a_version_1_profile_loads_with_its_host_readings_nested() -> None:
    """Version 1 kept the host's readings beside everything else; version 2 nests them.
    A file written by version 1 (a shipped profile as it was) loads, and written again in
    the current version and read back, it is the same profile."""
    import json
    from pathlib import Path

    path = Path(__file__).with_name("data") / "v1_resnet18_h200.json"
    doc = json.loads(path.read_text())
    p = Profile.load(str(path))
    assert doc["version"] == 1 and json.loads(p.to_json())["version"] == 3
    assert p.micro_batch_sizes == tuple(doc["micro_batches"])
    assert p.host.issue == doc["host_issue"] and p.host.pooled == doc["host_pooled"]
    assert p.host.windows == doc["host_windows"] and p.host.machine == doc["host_machine"]
    assert p.host.window_host == {int(k): tuple(v) for k, v in doc["window_host"].items()}
    assert len(p.blocks) == len(doc["blocks"])
    block = doc["blocks"][3]
    cost = p.blocks[3].costs[int(next(iter(block["costs"])))]
    assert cost.forward == next(iter(block["costs"].values()))["forward"]
    assert Profile.from_json(p.to_json()) == p


def test_a_version_2_profile_loads_its_sizes_under_their_new_name() -> None:
    """Version 2 called the measured sizes "micro_batches"; version 3 "micro_batch_sizes"."""
    import json

    p = shipped_profile("resnet50")
    doc = json.loads(p.to_json())
    doc["version"] = 2
    doc["micro_batches"] = doc.pop("micro_batch_sizes")
    assert Profile.from_json(json.dumps(doc)) == p
