"""The sharded optimizer (ZeRO-1) priced against whole copies, each number by hand
(planning/simulation/sharded_optimizer.py, memory.py, simulator.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.errors import ConfigError
from pipecast.planning.recommend.predict import Prediction, predict
from pipecast.planning.schedules import make_plan
from pipecast.planning.simulation import Costs, StageTimes
from pipecast.planning.simulation.memory import fixed_memory
from pipecast.values.hardware.presets import describe
from pipecast.values.strategy import Strategy

PARAMS = 1000
"""One stage of 1000 weight bytes."""


def _fixed(optimizer: str, shards: tuple[int, ...] = ()) -> tuple[int, int]:
    """(bytes held through the step, the optimizer step's temporaries) of one stage."""
    st = StageTimes(forward=1, backward_input=1, backward_weight=1, backward=2, param_bytes=PARAMS)
    costs = Costs(stages=(st,), optimizer=optimizer, optimizer_shards=shards)  # type: ignore[arg-type]
    fixed = fixed_memory(make_plan("1f1b", 1, 1), costs)
    return fixed.device[0], fixed.stepping[0]


@pytest.mark.parametrize(
    ("optimizer", "replicas", "held", "stepping"),
    [
        ("adam", 1, 4000, 1000),  # weights, gradients, two moments; a square root each
        ("adam", 2, 3000, 500),  # the moments halve: 2000 -> 1000
        ("adam", 4, 2500, 250),  # a quarter: 500
        ("momentum", 2, 2500, 0),  # one buffer, 1000 -> 500; SGD steps in place
        ("sgd", 2, 2000, 0),  # no state to shard
    ],
)
def test_the_state_and_the_steps_temporaries_are_divided_by_the_replicas(
    optimizer: str, replicas: int, held: int, stepping: int
) -> None:
    """Weights and gradients stay whole (1000 each); the state (Adam's two moments, 2000;
    momentum's buffer, 1000) and Adam's square roots (1000) are 1/R on each replica."""
    assert _fixed(optimizer, (replicas,)) == (held, stepping)
    assert _fixed(optimizer) == _fixed(optimizer, (1,))


GPUS = describe(gpus_per_node=2, memory="80GiB")  # 150 GB/s, 10 us inside the node
BLOCK = 4 * 10**8
"""Two blocks of 400 MB of weights each: 800 MB, enough that the all-gather's bandwidth
term (about 2.7 ms) shows beside its latency."""


def _data_parallel(shard_optimizer: bool, optimizer: str = "adam") -> Prediction:
    profile = make_profile([1e-3] * 2, params=[BLOCK] * 2)
    profile = replace(
        profile, blocks=tuple(replace(b, optimizer_step=1.5e-3) for b in profile.blocks)
    )
    strategy = Strategy(kind="data", replicas=2, shard_optimizer=shard_optimizer)
    return predict(profile, GPUS, strategy, 16, optimizer=optimizer)  # type: ignore[arg-type]


def test_data_parallel_x2_holds_half_of_adams_state() -> None:
    """800 MB of weights: Adam's moments are 1.6 GB on each of two whole copies, 0.8 GB on
    each replica sharding them; every other term (weights, gradients, the all-reduce's copy,
    activations) is the same, so the peaks differ by exactly 0.8 GB."""
    plain, sharded = _data_parallel(False), _data_parallel(True)
    assert plain.peak_memory - sharded.peak_memory == 2 * BLOCK


def test_each_replica_steps_half_and_then_gathers_the_weights() -> None:
    """The profile's SGD step is 3 ms, so Adam's is 7 ms (7 tensor passes against 3), and
    half of it, 3.5 ms, on each of two replicas; then the other half of the 800 MB comes
    from the other replica: an all-gather of 800 MB over 2 GPUs at 150 GB/s, half a ring
    all-reduce, 10 us + (1/2) x 800 MB / 150 GB/s. The gradients' all-reduce is unchanged."""
    plain, sharded = _data_parallel(False), _data_parallel(True)
    steps = [e for e in sharded.timeline.events if e.kind == "optimizer" and e.rank == 0]
    assert [e.duration for e in steps] == pytest.approx([3.5e-3])
    [gather] = [e for e in sharded.timeline.events if e.kind == "allgather" and e.rank == 0]
    want = 10e-6 + 0.5 * 2 * BLOCK / 150e9
    assert gather.duration == pytest.approx(want)
    assert gather.start == pytest.approx(steps[0].end)
    assert sharded.step_time == pytest.approx(plain.step_time - 3.5e-3 + want)
    assert sharded.timeline.exposed_comm == pytest.approx(plain.timeline.exposed_comm + want)


def test_a_pipelines_replicas_shard_each_stage() -> None:
    """Two stages of one 400 MB block each, two replicas of the pipeline: each stage's rank
    holds Adam's moments for half its block, 400 MB less than 800 MB."""
    profile = make_profile([1e-3] * 2, params=[BLOCK] * 2)
    cluster = describe(gpus_per_node=4, memory="80GiB")
    peaks = []
    for shard_optimizer in (False, True):
        strategy = Strategy(
            kind="hybrid", stages=2, replicas=2, microbatches=2, partition="0,1,2",
            shard_optimizer=shard_optimizer,
        )  # fmt: skip
        peaks.append(predict(profile, cluster, strategy, 32, optimizer="adam").timeline.peak_memory)
    assert [a - b for a, b in zip(*peaks, strict=True)] == [BLOCK, BLOCK]


@pytest.mark.parametrize(
    ("changes", "rule"),
    [({"replicas": 1, "kind": "single"}, "there is 1"), ({"shard": "full"}, "FSDP")],
)
def test_a_strategy_that_cannot_shard_its_optimizer_is_refused(
    changes: dict[str, object], rule: str
) -> None:
    profile = make_profile([1e-3] * 2)
    strategy = Strategy(**{"kind": "data", "replicas": 2, "shard_optimizer": True, **changes})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rule):
        predict(profile, GPUS, strategy, 16, optimizer="adam")


def test_the_strategy_names_it_and_keeps_it_through_its_json() -> None:
    data = Strategy(kind="data", replicas=2, shard_optimizer=True)
    assert data.label() == "data parallel x2, optimizer sharded"
    assert data.mesh() == "data parallel x2 (optimizer sharded)"
    assert Strategy.from_dict(data.to_dict()) == data
    assert Strategy.from_dict({"kind": "data", "replicas": 2}).shard_optimizer is False


def test_the_partition_counts_each_stages_share_of_the_state() -> None:
    """Two stages of one 1 GB block, two replicas, Adam: a stage holds weights, gradients
    and moments of 4 GB whole, above 4 GiB less the 10% margin (3.87 GB), so no split of
    whole copies exists; sharded over the two replicas the moments are 1 GB and the
    stage's 3 GB leaves room, so the partition splits it."""
    profile = make_profile([1e-3] * 2, params=[10**9] * 2)
    cluster = describe(gpus_per_node=4, memory="4GiB")
    for shard_optimizer in (False, True):
        strategy = Strategy(
            kind="hybrid", stages=2, replicas=2, microbatches=2, shard_optimizer=shard_optimizer
        )
        if not shard_optimizer:
            with pytest.raises(ConfigError, match=r"alone needs 3\.73 GiB"):
                predict(profile, cluster, strategy, 32, optimizer="adam")
            continue
        pred = predict(profile, cluster, strategy, 32, optimizer="adam")
        assert pred.partition.boundaries == [0, 1, 2]
