"""CUDA-graphed steps: what can be graphed, and the engine's side of the graphs against a
single process on CPU ranks, where each "graph" re-runs its body on the same static buffers
(`PIPECAST_GRAPHS_STAND_IN`; the capture itself needs a GPU: tests/runtime/test_gpu.py checks it
against one process there). Every graphed step after the first must replay one graph per
action that computes something: a run that never captured, and ran every step eagerly,
would give the same numbers."""

from __future__ import annotations

import functools

import pytest
import torch
from tests.runtime.helpers import (
    assert_close,
    assert_replayed,
    merged,
    pipeline_job,
    reference_step,
    run_all,
    weightless_first,
)

from pipecast.errors import ConfigError
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import strategy_of
from pipecast.planning.schedules.generators import make_plan
from pipecast.runtime import graphs
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.run import JobResult
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models.workload import Workload
from pipecast.values.partition import from_boundaries

LENET = Workload(model="lenet5", dataset="mnist")  # 12 blocks, no batch norm, no dropout


@pytest.mark.parametrize(
    ("schedule", "device", "reason"),
    [("1f1b", "cpu", "need --device cuda"), ("pipedream", "cuda", "stashed weights")],
)
def test_what_cannot_be_graphed_is_refused(schedule: str, device: str, reason: str) -> None:
    plan = make_plan(schedule, 2, 4)
    with pytest.raises(ConfigError, match=reason):
        graphs.check(plan, RunConfig(cuda_graphs=True), device)
    graphs.check(plan, RunConfig(cuda_graphs=False), device)  # asked off: nothing to refuse
    graphs.check(plan, RunConfig(), device)  # by default: graphed only where it can be
    assert graphs.enabled(plan, RunConfig(), device) is False


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"])
def test_every_synchronous_schedule_is_graphed_on_gpus_by_default(schedule: str) -> None:
    plan = make_plan(schedule, 2, 4)
    for recompute in ("none", "all"):
        for autocast in (False, True):
            config = RunConfig(recompute=recompute, autocast=autocast)  # type: ignore[arg-type]
            assert graphs.enabled(plan, config, "cuda")
            assert not graphs.enabled(plan, RunConfig(cuda_graphs=False), "cuda")
            assert not graphs.enabled(plan, config, "cpu")


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


GRAPHED = [
    ("gpipe", 2, 4, [0, 6, 12], 1, 12, "all-but-last"),
    ("1f1b", 3, 6, [0, 4, 8, 12], 1, 12, "none"),
    ("interleaved", 2, 4, [0, 3, 6, 9, 12], 1, 12, "all"),
    ("1f1b", 2, 3, [0, 6, 12], 2, 12, "none"),
    ("1f1b", 2, 4, [0, 6, 12], 1, 10, "none"),  # micro-batches of 3, 3, 2, 2
    ("zb-h1", 2, 4, [0, 5, 12], 1, 12, "none"),
    ("zb-h1", 2, 4, [0, 5, 12], 1, 12, "all"),
    ("zb-v", 2, 4, [0, 3, 6, 9, 12], 1, 12, "all"),
    ("zb-h1", 2, 4, [0, 5, 12], 1, 12, "weight-batch-2"),
]
STEPS = 3  # the first step eager, the next two replayed between the static buffers


@functools.cache
def _results() -> list[JobResult]:
    """The graphed jobs (then one whose first stage has no weights, and one forward-only)
    in one world per world size."""
    jobs = []
    for schedule, ranks, m, bounds, replicas, batch, how in GRAPHED:
        batched = how.startswith("weight-batch")  # else how the forward is recomputed
        recompute = "none" if batched else how
        config = RunConfig(lr=0.1, timeout_s=60, cuda_graphs=True, recompute=recompute)  # type: ignore[arg-type]
        jobs.append(
            pipeline_job(
                LENET, schedule, ranks, m, bounds, batch=batch, steps=STEPS, replicas=replicas,
                config=config, weight_batch=int(how.rsplit("-", 1)[1]) if batched else 1,
            )
        )  # fmt: skip
    config = RunConfig(lr=0.1, timeout_s=60, cuda_graphs=True)
    jobs.append(
        pipeline_job(
            LENET, "1f1b", 2, 4, [0, 1, 4], batch=8, steps=STEPS, config=config,
            model=weightless_first(),
        )
    )  # fmt: skip
    config = RunConfig(timeout_s=60, cuda_graphs=True)
    jobs.append(
        pipeline_job(LENET, "forward-only", 2, 3, [0, 6, 12], batch=12, steps=2, config=config)
    )
    return run_all(jobs, env={graphs.STAND_IN_ENV: "1"})


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(GRAPHED)))
def test_graphed_steps_match_single_process(case: int) -> None:
    result = _results()[case]
    _, _, _, _, replicas, batch, _ = GRAPHED[case]
    torch.manual_seed(0)
    want_params, want_grads = reference_step(LENET.build(), LENET, batch, steps=STEPS)
    for replica in range(replicas):
        assert_close(
            {k: v for r in result.reports if r.replica == replica for k, v in r.grads.items()},
            want_grads,
        )
    assert_close(merged(result, "params"), want_params)
    losses = [s.loss for r in result.reports for s in r.steps if s.loss is not None]
    assert len(losses) == STEPS * replicas
    assert_replayed(result)


@pytest.mark.slow
def test_a_first_stage_without_weights_captures_no_backward() -> None:
    result = _results()[-2]
    want_params, want_grads = reference_step(weightless_first(), LENET, 8, steps=STEPS)
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)
    assert_replayed(result, weightless_first=True)


@pytest.mark.slow
def test_graphed_inference_gives_one_process_outputs() -> None:
    result = _results()[-1]
    got = [r.outputs for r in result.reports if r.outputs]
    assert len(got) == 1
    assert_replayed(result)
    torch.manual_seed(0)
    x, _ = synthetic_batch(LENET.spec, 12, seed=1)  # the second (replayed) step's batch
    with torch.no_grad():
        want = LENET.build()(x)
    assert torch.allclose(torch.cat(got[0]), want, rtol=1e-5, atol=1e-6)


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
