"""CUDA-graph slots and what can be graphed (the capture itself needs a GPU:
benchmarks/cuda_graphs.py checks it against eager runs)."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, reference_step, run

from pipecast.bench.config import BenchConfig
from pipecast.bench.predictions import strategy_of
from pipecast.errors import ConfigError
from pipecast.models.workload import Workload
from pipecast.partition.types import from_boundaries
from pipecast.runtime import graphs
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.schedule.generators import make_plan
from pipecast.schedule.slots import slots

LENET = Workload(model="lenet5", dataset="mnist")  # 12 blocks, no batch norm, no dropout


def _held_apart(plan_name: str, ranks: int, m: int) -> dict[int, dict[int, int]]:
    """Every rank's slots per stage, after checking that no two micro-batches held at once
    on one stage share a slot and that every forward got one."""
    plan = make_plan(plan_name, ranks, m)
    counts = {}
    for rank, actions in enumerate(plan.actions):
        slot_of, count = slots(actions)
        live: dict[tuple[int, int], int] = {}
        for a in actions:
            if a.kind == "F":
                slot = slot_of[(a.stage, a.mb)]
                assert 0 <= slot < count[a.stage]
                assert (a.stage, slot) not in live, f"{plan_name} rank {rank}: {a} reuses a slot"
                live[(a.stage, slot)] = a.mb
            else:
                del live[(a.stage, slot_of[(a.stage, a.mb)])]
        assert not live
        assert {k for k in slot_of} == {(a.stage, a.mb) for a in actions if a.kind == "F"}
        counts[rank] = count
    return counts


def test_gpipe_holds_every_micro_batch() -> None:
    counts = _held_apart("gpipe", 2, 4)
    assert counts == {0: {0: 4}, 1: {1: 4}}


def test_one_f_one_b_holds_as_many_as_stages_remain() -> None:
    counts = _held_apart("1f1b", 4, 8)
    assert [counts[r][r] for r in range(4)] == [4, 3, 2, 1]


def test_interleaved_counts_each_virtual_stage() -> None:
    counts = _held_apart("interleaved", 2, 4)
    assert set(counts[0]) == {0, 2} and set(counts[1]) == {1, 3}
    assert all(n >= 1 for c in counts.values() for n in c.values())


def test_split_backwards_have_no_slots() -> None:
    plan = make_plan("zb-h1", 2, 4)
    with pytest.raises(ConfigError, match="whole backwards"):
        slots(plan.actions[1])


@pytest.mark.parametrize(
    ("schedule", "config", "device", "reason"),
    [
        ("1f1b", RunConfig(cuda_graphs=True), "cpu", "need --device cuda"),
        ("zb-h1", RunConfig(cuda_graphs=True), "cuda", "splits the backward"),
        ("pipedream", RunConfig(cuda_graphs=True), "cuda", "stashed weights"),
        ("1f1b", RunConfig(cuda_graphs=True, recompute="all"), "cuda", "recomputation"),
        ("1f1b", RunConfig(cuda_graphs=True, autocast=True), "cuda", "autocast"),
    ],
)
def test_what_cannot_be_graphed_is_refused(
    schedule: str, config: RunConfig, device: str, reason: str
) -> None:
    plan = make_plan(schedule, 2, 4)
    with pytest.raises(ConfigError, match=reason):
        graphs.check(plan, config, device)
    graphs.check(plan, RunConfig(), device)  # without graphs: nothing to refuse
    if schedule == "1f1b" and device == "cuda" and config.recompute == "none":
        assert graphs.unsupported(plan, RunConfig(cuda_graphs=True), "cuda") is None


def test_a_job_asking_for_graphs_on_cpu_fails_before_starting() -> None:
    job = TrainJob(
        plan=make_plan("1f1b", 2, 2),
        partition=from_boundaries([0, 6, 12]),
        batch=8,
        workload=Workload(model="lenet5", dataset="mnist"),
        config=RunConfig(cuda_graphs=True),
    )
    with pytest.raises(ConfigError, match="cuda_graphs: CUDA graphs need --device cuda"):
        job.check()


def test_bench_keys_of_eager_rows_are_unchanged() -> None:
    base = BenchConfig(
        suite="s",
        system="pipecast",
        workload=Workload(model="lenet5", dataset="mnist"),
        gpus=2,
        batch=8,
        boundaries=(0, 6, 12),
    )
    assert "cuda_graphs" not in base.key
    graphed = BenchConfig(**{**base.__dict__, "cuda_graphs": True})
    assert '"cuda_graphs": true' in graphed.key
    assert graphed.label().endswith("graphs") and not base.label().endswith("graphs")
    assert BenchConfig.from_dict(graphed.to_dict()) == graphed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schedule", "ranks", "m", "bounds", "replicas", "batch"),
    [
        ("gpipe", 2, 4, [0, 6, 12], 1, 12),
        ("1f1b", 3, 6, [0, 4, 8, 12], 1, 12),
        ("interleaved", 2, 4, [0, 3, 6, 9, 12], 1, 12),
        ("1f1b", 2, 3, [0, 6, 12], 2, 12),
        ("1f1b", 2, 4, [0, 6, 12], 1, 10),  # micro-batches of 3, 3, 2, 2: the 2s run eagerly
    ],
)
def test_graphed_steps_match_single_process(
    monkeypatch: pytest.MonkeyPatch,
    schedule: str,
    ranks: int,
    m: int,
    bounds: list[int],
    replicas: int,
    batch: int,
) -> None:
    """The engine's graphed path on CPU ranks, with each slot's fixed buffers played by
    SlotStandIn: the first step eager, then two through the slots."""
    monkeypatch.setenv(graphs.STAND_IN_ENV, "1")
    steps = 3
    config = RunConfig(lr=0.1, timeout_s=60, cuda_graphs=True)
    job = pipeline_job(
        LENET,
        schedule,
        ranks,
        m,
        bounds,
        batch=batch,
        steps=steps,
        replicas=replicas,
        config=config,
    )
    result = run(job)
    torch.manual_seed(0)
    want_params, want_grads = reference_step(LENET.build(), LENET, batch, steps=steps)
    for replica in range(replicas):
        assert_close(
            {k: v for r in result.reports if r.replica == replica for k, v in r.grads.items()},
            want_grads,
        )
    assert_close(merged(result, "params"), want_params)


def test_bench_predicts_a_graphed_configuration_as_graphed() -> None:
    base = BenchConfig(
        suite="s",
        system="pipecast",
        workload=LENET,
        gpus=2,
        batch=8,
        schedule="gpipe",
        microbatches=4,
        boundaries=(0, 6, 12),
    )
    graphed = BenchConfig(**{**base.__dict__, "cuda_graphs": True})
    eager_strategy, graphed_strategy = strategy_of(base), strategy_of(graphed)
    assert eager_strategy is not None and graphed_strategy is not None
    assert not eager_strategy.cuda_graphs and graphed_strategy.cuda_graphs
    one = BenchConfig(**{**graphed.__dict__, "gpus": 1, "boundaries": (0, 12)})
    single = strategy_of(one)
    assert single is not None and single.kind == "single" and single.cuda_graphs
