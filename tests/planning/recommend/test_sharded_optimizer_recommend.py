"""recommend offers the sharded optimizer (ZeRO-1) beside whole copies and FSDP wherever
there are replicas and an optimizer with state, and ranks it by its own price."""

from __future__ import annotations

from tests.planning.partition.test_partition import make_profile

from pipecast.orchestration.recommend.validate import job_for
from pipecast.planning.recommend.enumerate import strategies
from pipecast.planning.recommend.predict import predict
from pipecast.planning.recommend.rank import recommend
from pipecast.runtime.config import RunConfig
from pipecast.values.hardware.presets import describe
from pipecast.values.models import Workload
from pipecast.values.strategy import Strategy

BLOCK = 4 * 10**8
"""Two blocks of 400 MB of weights: P = 800 MB."""


def test_it_is_offered_beside_each_layout_with_replicas_and_whole_copies() -> None:
    """On 4 GPUs: data parallel x2 and x4 and the pipeline of 2 stages x 2 replicas each
    come once more with the state sharded; one GPU, a pipeline without replicas, FSDP and
    tensor parallelism never do."""
    offered = list(strategies(4, 64, blocks=4, tensor_parallel=(2,), shard_optimizer=True))
    sharded = [s for s in offered if s.shard_optimizer]
    plain = [s for s in offered if s.replicas > 1 and s.shard == "none" and s.tp == 1]
    plain = [s for s in plain if s.weight_batch == 1 and not s.shard_optimizer]
    assert sorted(map(repr, sharded)) == sorted(
        repr(Strategy(**{**s.to_dict(), "shard_optimizer": True})) for s in plain
    )
    assert {(s.kind, s.replicas) for s in sharded} == {("data", 2), ("data", 4), ("hybrid", 2)}
    assert not any(s.shard_optimizer for s in strategies(4, 64, blocks=4))


def test_it_fits_where_whole_copies_of_adams_state_do_not() -> None:
    """Data parallel x2 over P = 800 MB under Adam: whole copies hold weights, gradients
    and two moments (4P = 3.2 GB) and the all-reduce's copy of the gradients (P): 4.0 GB,
    above 4 GiB less the 10% margin (3.87 GB); sharded, the moments are P a replica and the
    peak 3.2 GB fits."""
    profile = make_profile([1e-3] * 2, params=[BLOCK] * 2)
    cluster = describe(gpus_per_node=2, memory="4GiB")
    rec = recommend(profile, cluster, 16, gpus=2, optimizer="adam", cuda_graphs=False)
    data = [
        p.strategy for p in rec.ranked if p.strategy.kind == "data" and p.strategy.shard == "none"
    ]
    assert any(s.shard_optimizer and s.offload == "none" for s in data)
    assert not any(not s.shard_optimizer and s.offload == "none" for s in data)
    refused = [r.strategy for r in rec.rejected if r.strategy.kind == "data"]
    assert any(not s.shard_optimizer and s.shard == "none" for s in refused)


def test_sgd_has_no_state_to_shard() -> None:
    profile = make_profile([1e-3] * 2, params=[BLOCK] * 2)
    cluster = describe(gpus_per_node=2, memory="80GiB")
    rec = recommend(profile, cluster, 16, gpus=2, optimizer="sgd")
    assert not any(p.strategy.shard_optimizer for p in rec.ranked)
    rec = recommend(profile, cluster, 16, gpus=2, optimizer="adam")
    assert any(p.strategy.shard_optimizer for p in rec.ranked)


def test_measuring_a_recommendation_runs_it_sharded() -> None:
    """--validate measures the strategy that was priced: its job shards the optimizer."""
    profile = make_profile([1e-3] * 2, params=[BLOCK] * 2)
    cluster = describe(gpus_per_node=2, memory="80GiB")
    for sharded in (False, True):
        strategy = Strategy(kind="data", replicas=2, shard_optimizer=sharded)
        pred = predict(profile, cluster, strategy, 16, optimizer="adam")
        job = job_for(
            pred, Workload(model="lenet5", dataset="mnist"), device="cpu", config=RunConfig()
        )
        assert job.config.shard_optimizer is sharded
