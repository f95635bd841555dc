"""Recommend's pipeline depths beyond powers of two and interleaving over 2 to 4 virtual
stages per rank (issue 67), each priced by the simulator as any other strategy."""

from __future__ import annotations

import functools

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.depths import pipeline_depths, virtual_counts
from pipecast.planning.recommend.enumerate import strategies
from pipecast.planning.recommend.predict import Prediction, predict
from pipecast.planning.recommend.rank import recommend
from pipecast.planning.schedules import make_plan
from pipecast.values.hardware.presets import describe
from pipecast.values.strategy import Strategy

SIX = describe(gpus_per_node=6, memory="80GiB", intra_bandwidth="100GB/s")


@pytest.mark.parametrize(
    ("ranks", "blocks", "depths"),
    [
        (6, 12, [2, 3, 6]),  # 3 divides the 12 blocks
        (6, 10, [2, 6]),  # 3 does not: only the powers of two and the ranks themselves
        (8, 12, [2, 4, 8]),
        (12, 12, [2, 3, 4, 6, 12]),
        (12, 8, [2, 4, 12]),
        (2, 12, [2]),
        (1, 12, []),
    ],
)
def test_depths_are_powers_of_two_and_the_divisors_the_blocks_share(
    ranks: int, blocks: int, depths: list[int]
) -> None:
    assert pipeline_depths(ranks, blocks) == depths


@pytest.mark.parametrize(
    ("schedule", "depth", "blocks", "counts"),
    [
        ("interleaved", 2, 12, [2, 3, 4]),
        ("interleaved", 4, 12, [2, 3]),  # 16 stages would leave a stage no block
        ("interleaved", 6, 12, [2]),
        ("interleaved", 8, 12, []),
        ("zb-v", 4, 12, [2]),
        ("zb-v", 8, 12, []),
        ("1f1b", 8, 12, [1]),
    ],
)
def test_virtual_counts_leave_every_stage_a_block(
    schedule: str, depth: int, blocks: int, counts: list[int]
) -> None:
    assert virtual_counts(schedule, depth, blocks) == counts


def test_enumeration_offers_four_virtual_stages_and_three_deep_pipelines() -> None:
    """On 6 GPUs (and the 1, 2 and 4 of them also tried), 12 blocks: 2 to 4 virtual stages
    where they leave each stage a block, and depth 3 beside 2, 4 and 6."""
    offered = list(strategies(6, 48, blocks=12))
    interleaved = {(s.stages, s.virtual) for s in offered if s.schedule == "interleaved"}
    assert interleaved == {(2, 2), (2, 3), (2, 4), (3, 2), (3, 3), (3, 4), (4, 2), (4, 3), (6, 2)}
    assert {s.stages for s in offered if s.kind in ("pipeline", "hybrid")} == {2, 3, 4, 6}
    assert all(s.virtual == 0 for s in offered if s.schedule != "interleaved")


@functools.cache
def _ranked() -> tuple[Prediction, ...]:
    profile = make_profile([1e-3] * 12, params=[10**6] * 12)
    return tuple(recommend(profile, SIX, 48, gpus=6, schedules=("1f1b", "interleaved")).ranked)


def test_recommend_ranks_four_virtual_stages_and_a_pipeline_three_deep() -> None:
    """Both priced as any other strategy: the v=4 row's plan and partition have 4 stages a
    rank, placed in a loop, and its step is the simulator's on that plan."""
    ranked = _ranked()
    four = [p for p in ranked if p.strategy.virtual == 4]
    three = [p for p in ranked if p.strategy.stages == 3]
    assert four and three
    for pred in four:
        ranks = pred.strategy.stages
        assert pred.plan.num_stages == pred.partition.num_stages == 4 * ranks
        assert pred.plan.stage_to_rank == tuple(s % ranks for s in range(4 * ranks))
        assert "x4 virtual" in pred.strategy.label()
    assert {p.strategy.replicas for p in three} == {2}


def test_more_virtual_stages_shrink_the_predicted_bubble() -> None:
    """Two ranks, 24 equal blocks, nothing to transfer or hold: a rank computes 12 blocks x
    M micro-batches and waits (p - 1) stages' work, a stage being 12/v blocks (Narayanan et
    al. 2021): v = 2, 3, 4 wait for 6, 4, 3 blocks' F + B, a bubble of (p-1)/(v M) of the
    ideal step."""
    profile = make_profile([1e-3] * 24, out_bytes=[0] * 24, saved=[0] * 24, params=[0] * 24)
    cluster = describe(gpus_per_node=2, memory="80GiB")
    m, block = 4, 3e-3  # F + B of a block: 1 ms + 2 ms
    for v in (2, 3, 4):
        strategy = Strategy(
            kind="pipeline", stages=2, schedule="interleaved", virtual=v, microbatches=m
        )
        pred = predict(profile, cluster, strategy, 8 * m, runtime=False)
        assert pred.partition.boundaries == list(range(0, 25, 12 // v))
        assert pred.plan == make_plan("interleaved", 2, m, virtual=v)
        assert pred.step_time == pytest.approx((12 * m + 12 / v) * block)
        x = 1 / (v * m)
        assert pred.timeline.bubble_fraction == pytest.approx(x / (1 + x))
