"""The fastest way to serve a model (recommend(serving=True)): forward-only strategies,
ranked by the time to answer the batch."""

from __future__ import annotations

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.rank import recommend
from pipecast.values.hardware.presets import describe
from pipecast.values.strategy import Strategy

GIB = 2**30
GPUS = describe(gpus_per_node=4, memory="80GiB", intra_bandwidth="100GB/s")


def test_replicas_answer_a_batch_with_their_forwards_alone() -> None:
    """4 blocks of 1 ms at micro-batch 8: four replicas answer 32 samples in one forward of
    8 each, 4 ms, with no gradients to all-reduce; training the same way costs more."""
    profile = make_profile([1e-3] * 4)
    rec = recommend(profile, GPUS, 32, serving=True, cuda_graphs=False)
    assert all(p.strategy.schedule == "forward-only" for p in rec.ranked)
    assert rec.best.strategy == Strategy(kind="data", replicas=4, schedule="forward-only")
    assert rec.best.step_time == pytest.approx(4e-3)
    trained = recommend(profile, GPUS, 32, cuda_graphs=False)
    assert trained.best.step_time > rec.best.step_time


def test_one_request_is_answered_without_splitting_it() -> None:
    """Batch 1: nothing to share between replicas; pipelines carry the request through
    their stages one after another, so one device answers soonest."""
    rec = recommend(make_profile([1e-3] * 4), GPUS, 1, serving=True, cuda_graphs=False)
    assert rec.best.strategy.kind == "single"
    assert {p.strategy.kind for p in rec.ranked} == {"single", "pipeline"}
    assert all(p.strategy.microbatches == 1 for p in rec.ranked)


def test_a_model_too_large_for_one_gpu_is_served_by_a_pipeline() -> None:
    """4 blocks of 1 GiB of weights on GPUs of 3 GiB: no replica holds the model; 4 stages of
    one block each do."""
    profile = make_profile([1e-3] * 4, params=[GIB] * 4)
    small = describe(gpus_per_node=4, memory="3GiB", intra_bandwidth="100GB/s")
    rec = recommend(profile, small, 32, serving=True, cuda_graphs=False)
    assert {p.strategy.kind for p in rec.ranked} == {"pipeline"}
    assert rec.best.strategy.stages == 4
    assert max(rec.best.timeline.peak_memory) < 3 * GIB
