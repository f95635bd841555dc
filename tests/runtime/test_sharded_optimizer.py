"""The sharded optimizer (ZeRO-1, pipecast.runtime.sharded_optimizer) on two gloo CPU
ranks: each replica keeps Adam's state for part of the weights only, and the replicas still
take the steps one process takes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.runtime.helpers import assert_replayed, pipeline_job, run_all
from torch import nn

from pipecast.errors import ConfigError
from pipecast.runtime import graphs
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.config import RunConfig
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.run import JobResult
from pipecast.runtime.sharded_optimizer import shard_optimizers, state_elements
from pipecast.runtime.stage import StageModule
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload

LENET = Workload(model="lenet5", dataset="mnist")  # 12 blocks, no batch norm, no dropout
ADAM = RunConfig(lr=0.01, timeout_s=60, optimizer="adam", shard_optimizer=True)
STEPS, BATCH = 3, 12


def _one_process_adam() -> dict[str, torch.Tensor]:
    """One process stepping the whole model with torch's own Adam on the runtime's batches
    (the whole batch each step, as the replicas' summed gradients give it)."""
    torch.manual_seed(0)
    model = LENET.build()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = synthetic_batch(LENET.spec, BATCH, seed=step)
        loss_for(LENET.spec)(model(x), y).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def results() -> dict[str, JobResult]:
    """Two replicas of one stage, accumulating 2 micro-batches each, eager and replayed
    as graphs (the stand-in for CUDA graphs on CPU ranks: the update runs between the
    graphs); and two replicas of a pipeline of two stages (four ranks), each stage sharding
    its optimizer over its own replicas."""
    data = pipeline_job(
        LENET, "1f1b", 1, 2, [0, 12], batch=BATCH, replicas=2, config=ADAM, steps=STEPS
    )
    hybrid = pipeline_job(
        LENET, "1f1b", 2, 2, [0, 5, 12], batch=BATCH, replicas=2, config=ADAM, steps=STEPS
    )
    graphed = replace(data, config=replace(ADAM, cuda_graphs=True))
    names = ("data", "hybrid", "graphed")
    ran = run_all([data, hybrid, graphed], env={graphs.STAND_IN_ENV: "1"})
    return dict(zip(names, ran, strict=True))


@pytest.mark.parametrize("layout", ["data", "hybrid", "graphed"])
def test_every_replica_ends_with_one_process_weights(
    results: dict[str, JobResult], layout: str
) -> None:
    """Each replica steps its share and takes the others' from them: both hold the weights
    one process's Adam reaches. Adam divides by the root of the squared gradient, so fp32
    noise on a near-zero gradient moves a weight by up to a whole step (lr); a share not
    sent, stepped twice or never must move many by lr. Three steps agree to a twentieth."""
    want = _one_process_adam()
    for replica in (0, 1):
        got = {}
        for report in results[layout].reports:
            if report.replica == replica:
                got.update(report.params)
        assert set(got) == set(want)
        worst = max((got[n] - want[n]).abs().max().item() for n in want)
        assert worst < 0.01 / 20, f"replica {replica}: a weight off by {worst:.2e}"


@pytest.mark.parametrize("layout", ["data", "hybrid", "graphed"])
def test_the_run_splits_adams_state_between_the_replicas(
    results: dict[str, JobResult], layout: str
) -> None:
    """Each rank of the run holds Adam's two moments for part of its stages' weights only:
    the two replicas of a pipeline rank hold them for all of those weights between them."""
    reports = results[layout].reports
    for pipeline_rank in {r.pipeline_rank for r in reports}:
        mine = [r for r in reports if r.pipeline_rank == pipeline_rank]
        weights = sum(t.numel() for t in mine[0].params.values())
        held = [r.optimizer_state for r in mine]
        assert len(held) == 2 and sum(held) == 2 * weights, (held, weights)
        assert all(0 < h < 2 * weights for h in held), (held, weights)


def test_the_graphed_run_replayed_its_graphs(results: dict[str, JobResult]) -> None:
    assert_replayed(results["graphed"])


def _state_on_rank(ctx: Context) -> dict[str, Any]:
    """One stage of three Linears on each of two ranks, its optimizer sharded: the Adam
    state elements this rank holds after a step, and its weights."""
    torch.manual_seed(0)
    blocks = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4))
    config = RunConfig(lr=0.01, optimizer="adam", shard_optimizer=True)
    stage = StageModule(0, blocks, ctx.device, config, first=True, last=True)
    shard_optimizers({0: stage}, dist.new_group([0, 1]))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(ctx.rank))
    stage.module(x).square().sum().backward()
    for p in stage.params:  # the engine's all-reduce: the same gradients on both
        assert p.grad is not None
        dist.all_reduce(p.grad)
    assert stage.optimizer is not None
    stage.optimizer.step()
    state = state_elements(stage.optimizer)  # exp_avg and exp_avg_sq of its share
    return {"state": state, "weights": [p.detach().clone() for p in stage.params]}


def test_each_replica_holds_part_of_the_state_and_the_same_weights() -> None:
    """Adam's two moments over all 484 weights are 968 numbers: the two replicas hold them
    between them, neither all of them, and end the step with equal weights."""
    got = spawn(_state_on_rank, 2, timeout_s=60)
    whole = (8 * 16 + 16) + (16 * 16 + 16) + (16 * 4 + 4)
    assert whole == 484
    held = [g["state"] for g in got]
    assert sum(held) == 2 * whole and all(0 < h < 2 * whole for h in held), held
    for a, b in zip(got[0]["weights"], got[1]["weights"], strict=True):
        assert torch.equal(a, b)


def test_without_a_replica_group_it_is_refused() -> None:
    stage = StageModule(0, nn.Sequential(nn.Linear(2, 2)), torch.device("cpu"), ADAM,
                        first=True, last=True)  # fmt: skip
    with pytest.raises(ConfigError, match="replicas"):
        shard_optimizers({0: stage}, None)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"replicas": 1}, "there is 1"),
        ({"shard": "grad"}, "FSDP"),
        ({"offload": "optimizer"}, "on the host"),
        ({"checkpoint": "dir"}, "checkpoints"),
    ],
)
def test_a_job_that_cannot_shard_its_optimizer_is_refused_before_it_starts(
    changes: dict[str, Any], rule: str, tmp_path: Any
) -> None:
    """One replica has nothing to share the state with; FSDP shards it already; a host
    optimizer and a checkpoint of one replica's state would each miss the rest."""
    config = replace(ADAM, offload=changes.pop("offload", "none"))
    job = pipeline_job(LENET, "1f1b", 1, 2, [0, 12], batch=BATCH, replicas=2, config=config)
    if changes.pop("checkpoint", None):
        changes["checkpoint"] = Checkpointing(dir=str(tmp_path))
    with pytest.raises(ConfigError, match=rule):
        replace(job, **changes).check()
