"""Selective recomputation priced (planning/simulation/recomputation.py): blocks that keep
their input and their products' outputs, and rerun the rest in their backward, checked
against steps and memory worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.errors import ConfigError
from pipecast.planning.recommend.predict import predict
from pipecast.planning.simulation.recomputation import rerun
from pipecast.values.hardware.presets import describe
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

CLUSTER = replace(describe(gpus_per_node=2, memory="80GiB"), matmul_flops=1e12)


def _profile(kept: int | None = 1500) -> Profile:
    """Four blocks of 1 ms forward, 5e7 FLOPs a sample, 1000-byte outputs, saving 4000
    bytes each, of which a selective checkpoint keeps `kept`; measured at micro-batch 8."""
    profile = make_profile([1e-3] * 4, saved=[4000] * 4)
    return replace(
        profile,
        blocks=tuple(
            replace(
                b, forward_flops=50_000_000, costs={8: replace(b.costs[8], selective_bytes=kept)}
            )
            for b in profile.blocks
        ),
    )


def test_the_rerun_is_the_forward_beyond_its_products() -> None:
    """1 ms of forward, 4e8 FLOPs at 1e12 FLOP/s of products: 0.6 ms of other ops; without
    the FLOPs or the rate, the whole forward; never below 0."""
    assert rerun(1e-3, 4e8, 1e12) == pytest.approx(6e-4)
    assert rerun(1e-3, 0, 1e12) == rerun(1e-3, 4e8, 0) == 1e-3
    assert rerun(1e-3, 4e9, 1e12) == 0.0


def test_selective_keeps_less_for_a_rerun_of_the_cheap_ops() -> None:
    """One GPU, micro-batch 8. Memory: not recomputed, the four blocks keep 4 x 4000; each
    selective block keeps 1500 and its input (1000, the first's being the batch): 9000,
    and the last block's backward makes 4000 - 2500 again on top: 10,500, so 5500 less.
    Time: each backward reruns 1 ms less 8 x 5e7 FLOPs at 1e12 (0.4 ms): 4 x 0.6 ms more.
    Recomputing all, a block at a time (one GPU holds the whole model), keeps blocks 1-3's
    inputs (3000) and remakes one block's 4000 at a time: 9000 less, for 4 x 1 ms."""
    plain, chosen, full = (
        predict(_profile(), CLUSTER, Strategy(kind="single", recompute=r), 8)
        for r in ("none", "selective", "all")
    )
    assert plain.peak_memory - chosen.peak_memory == 5500
    assert chosen.step_time - plain.step_time == pytest.approx(2.4e-3)
    assert plain.peak_memory - full.peak_memory == 16000 - (3000 + 4000)
    assert full.step_time - plain.step_time == pytest.approx(4e-3)


def test_a_selective_pipeline_keeps_less_than_none_for_less_time_than_all() -> None:
    """2 stages x 4 micro-batches of 1F1B: selective is slower than none and faster than
    recomputing all, and keeps the least of the three here (each micro-batch in flight
    keeps 2 x 1500 plus inputs where all keeps its input but makes a stage's 8000 again)."""
    preds = {
        r: predict(
            _profile(),
            CLUSTER,
            Strategy(kind="pipeline", stages=2, microbatches=4, recompute=r),
            32,
        )  # type: ignore[arg-type]
        for r in ("none", "selective", "all")
    }
    times = [preds[r].step_time for r in ("none", "selective", "all")]
    assert times == sorted(times) and len(set(times)) == 3
    assert preds["selective"].peak_memory < preds["all"].peak_memory < preds["none"].peak_memory


def test_a_profile_without_the_reading_is_refused() -> None:
    with pytest.raises(ConfigError, match="profile the model again"):
        predict(_profile(None), CLUSTER, Strategy(kind="single", recompute="selective"), 8)
