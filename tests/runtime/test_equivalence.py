"""Every runtime feature must give the gradients and weights of a single-process step.

The jobs run together, one spawned world per world size (helpers.run_all): each builds its
own stages from the same seed and draws its own batches, as it would in a world of its own.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, reference_step, run_all
from torch import nn

from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.run import JobResult
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload
from pipecast.values.strategy import Strategy

LENET = Workload(model="lenet5", dataset="mnist")  # 12 blocks, no batch norm, no dropout
CASES = [
    ("gpipe", 2, 4, [0, 6, 12]),
    ("1f1b", 3, 6, [0, 4, 8, 12]),
    ("interleaved", 2, 4, [0, 3, 6, 9, 12]),
    ("zb-h1", 2, 4, [0, 5, 12]),
    ("zb-v", 2, 4, [0, 3, 6, 9, 12]),
    ("zb-v", 2, 8, [0, 3, 6, 9, 12]),  # deadlocked once when sends were held back too long
]
RECOMPUTE = [
    ("gpipe", "all-but-last", [0, 6, 12]),
    ("1f1b", "all", [0, 6, 12]),
    ("zb-h1", "all", [0, 6, 12]),
    ("interleaved", "all", [0, 3, 6, 9, 12]),
    ("zb-v", "all", [0, 3, 6, 9, 12]),
]
OPTIMIZERS = [("1f1b", "momentum"), ("zb-h1", "adam")]
WEIGHT_BATCHES = [("zb-h1", [0, 5, 12], 2), ("zb-v", [0, 3, 6, 9, 12], 4)]
"""W of 2 and of all 4 micro-batches as one (Plan.weight_batch)."""
OFFLOAD = [
    ("1f1b", "none", [0, 6, 12], "activations"),
    ("zb-h1", "none", [0, 6, 12], "activations"),
    ("gpipe", "all-but-last", [0, 6, 12], "activations"),
    ("gpipe", "none", [0, 6, 12], "all"),
]
"""Activations on the host: alone under one backward and a split one, and beside GPipe's
recomputation (the last micro-batch offloads, the others recompute); and beside streamed
weights."""


def _inplace_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(4 * 14 * 14, 10),
    )


def _batch_norm_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 28 * 28, 10),
    )


def _segmented_model() -> nn.Sequential:
    """Blocks of 8 weight tensors, so a stage runs as several graphs under a split backward
    (pipecast.values.profile.segments), one of them after an in-place ReLU the cut must move
    past."""
    torch.manual_seed(0)

    def deep() -> nn.Sequential:
        convs = [m for _ in range(3) for m in (nn.Conv2d(2, 2, 3, padding=1), nn.Tanh())]
        return nn.Sequential(*convs, nn.Conv2d(2, 2, 3, padding=1))

    return nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1),
        deep(),
        nn.ReLU(inplace=True),
        deep(),
        nn.Identity(),
        deep(),
        nn.Flatten(),
        nn.Linear(2 * 28 * 28, 10),
    )


def _jobs() -> dict[str, TrainJob]:
    jobs: dict[str, TrainJob] = {}
    for schedule, ranks, m, bounds in CASES:
        batch = 24 if m > 6 else 12
        # two steps: the second runs without shape headers, with sends posted as planned
        jobs[f"{schedule}-{ranks}-{m}"] = pipeline_job(
            LENET, schedule, ranks, m, bounds, batch=batch, steps=2
        )
    jobs["hybrid"] = pipeline_job(LENET, "1f1b", 2, 3, [0, 6, 12], batch=12, replicas=2)
    for schedule, bounds, k in WEIGHT_BATCHES:
        jobs[f"weight-batch-{schedule}-{k}"] = pipeline_job(
            LENET, schedule, 2, 4, bounds, batch=12, steps=2, weight_batch=k
        )
    for schedule, recompute, bounds in RECOMPUTE:
        config = RunConfig(lr=0.1, timeout_s=60, recompute=recompute)  # type: ignore[arg-type]
        jobs[f"recompute-{schedule}"] = pipeline_job(
            LENET, schedule, 2, 4, bounds, batch=12, config=config
        )
    for schedule, optimizer in OPTIMIZERS:
        for offload in ("none", "optimizer", "weights"):
            config = RunConfig(lr=0.01, timeout_s=60, optimizer=optimizer, offload=offload)  # type: ignore[arg-type]
            jobs[f"optimizer-{optimizer}-{offload}"] = pipeline_job(
                LENET, schedule, 2, 4, [0, 5, 12], batch=12, config=config, steps=3
            )
    jobs["inplace"] = pipeline_job(
        LENET, "1f1b", 3, 4, [0, 1, 4, 7], batch=8, model=_inplace_model()
    )
    for recompute in ("none", "all"):
        config = RunConfig(lr=0.1, timeout_s=60, recompute=recompute)  # type: ignore[arg-type]
        jobs[f"segmented-{recompute}"] = pipeline_job(
            LENET, "zb-h1", 2, 4, [0, 1, 8], batch=8, model=_segmented_model(), config=config,
            steps=2,
        )  # fmt: skip
    for schedule, recompute, bounds, offload in OFFLOAD:
        config = RunConfig(lr=0.1, timeout_s=60, recompute=recompute, offload=offload)  # type: ignore[arg-type]
        jobs[f"offload-{schedule}-{offload}"] = pipeline_job(
            LENET, schedule, 2, 4, bounds, batch=12, config=config
        )
    strategy, bounds = _recommended_for_small_gpus()
    config = RunConfig(lr=0.1, timeout_s=60, offload=strategy.offload)
    jobs["recommended-offload"] = pipeline_job(
        LENET, strategy.schedule, strategy.stages, strategy.microbatches, bounds, batch=12,
        config=config,
    )  # fmt: skip
    jobs["inference"] = pipeline_job(LENET, "forward-only", 2, 3, [0, 6, 12], batch=12, steps=2)
    jobs["inference-bn"] = pipeline_job(
        LENET, "forward-only", 2, 3, [0, 3, 5], batch=12, steps=1, model=_batch_norm_model()
    )
    return jobs


@functools.cache
def _recommended_for_small_gpus() -> tuple[Strategy, list[int]]:
    """What `recommend` answers for LeNet's 12 blocks priced as 1 GiB of weights each, on 2
    GPUs of 10 GiB (9 usable): no stage holds its 6 GiB of weights and 6 of gradients;
    streamed, it holds the gradients and two blocks' weights, 8 GiB."""
    from tests.planning.partition.test_partition import make_profile

    from pipecast.planning.recommend.rank import recommend
    from pipecast.values.hardware.presets import describe

    profile = make_profile([1e-3] * 12, params=[2**30] * 12)
    best = recommend(profile, describe(gpus_per_node=2, memory="10GiB"), 12, gpus=2).best
    return best.strategy, best.partition.boundaries


@functools.cache
def _results() -> dict[str, JobResult]:
    jobs = _jobs()
    return dict(zip(jobs, run_all(list(jobs.values())), strict=True))


def _reference(
    batch: int = 12, steps: int = 1
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    return reference_step(LENET.build(), LENET, batch, steps=steps)


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "ranks", "m", "bounds"), CASES)
def test_schedule_matches_single_process(
    schedule: str, ranks: int, m: int, bounds: list[int]
) -> None:
    result = _results()[f"{schedule}-{ranks}-{m}"]
    steps = 2
    want_params, want_grads = _reference(24 if m > 6 else 12, steps)
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)
    losses = [s.loss for r in result.reports for s in r.steps if s.loss is not None]
    assert len(losses) == steps


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "bounds", "k"), WEIGHT_BATCHES)
def test_batched_weight_gradients_match_single_process(
    schedule: str, bounds: list[int], k: int
) -> None:
    result = _results()[f"weight-batch-{schedule}-{k}"]
    want_params, want_grads = _reference(12, steps=2)
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)


@pytest.mark.slow
def test_hybrid_two_by_two_matches_single_process() -> None:
    result = _results()["hybrid"]
    want_params, want_grads = _reference()
    for replica in (0, 1):  # both replicas hold the same, all-reduced result
        got = {}
        for r in result.reports:
            if r.replica == replica:
                got.update(r.grads)
        assert_close(got, want_grads)
    assert_close(merged(result, "params"), want_params)


@pytest.mark.slow
@pytest.mark.parametrize(
    "job",
    [f"recompute-{s}" for s, _, _ in RECOMPUTE] + [f"offload-{s}-{o}" for s, _, _, o in OFFLOAD],
)
def test_recomputed_and_offloaded_activations_match(job: str) -> None:
    """What the backward uses, recomputed or brought back from the host, is what one process
    keeps."""
    result = _results()[job]
    want_params, want_grads = _reference()
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)


@pytest.mark.slow
def test_the_strategy_recommended_for_too_small_gpus_trains_as_one_process() -> None:
    """The issue's case on CPU ranks: below what every plain strategy needs, `recommend`
    answers with the weights on the host, and running its answer gives one process's step."""
    strategy, _ = _recommended_for_small_gpus()
    assert strategy.offload in ("weights", "all") and strategy.kind == "pipeline"
    result = _results()["recommended-offload"]
    want_params, want_grads = _reference()
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)


def _optimizer_reference(optimizer: str, steps: int) -> dict[str, torch.Tensor]:
    """One process stepping the whole model with torch's own optimizer on the same batches
    (Adam and momentum keep state per parameter, so per-stage optimizers equal one)."""
    torch.manual_seed(0)
    model = LENET.build()
    opt: Any = (
        torch.optim.Adam(model.parameters(), lr=0.01)
        if optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    )
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        x, y = synthetic_batch(LENET.spec, 12, seed=step)
        loss_for(LENET.spec)(model(x), y).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("offload", ["none", "optimizer", "weights"])
@pytest.mark.parametrize(("schedule", "optimizer"), OPTIMIZERS)
def test_stateful_optimizers_match_one_process(schedule: str, optimizer: str, offload: str) -> None:
    """Each stage's optimizer, on the device or stepping a copy of its weights on the host
    (which, streamed, is the only copy), takes the steps one process takes."""
    result = _results()[f"optimizer-{optimizer}-{offload}"]
    got, want = merged(result, "params"), _optimizer_reference(optimizer, 3)
    if optimizer == "momentum":
        assert_close(got, want, rtol=1e-4)
        return
    # Adam divides by the root of the squared gradient, so fp32 noise on a near-zero
    # gradient moves a weight by up to a whole step (lr); a lost, doubled or per-micro-batch
    # step moves many by lr. Three steps must agree to a twentieth of one.
    assert set(got) == set(want)
    worst = max((got[n] - want[n]).abs().max().item() for n in want)
    assert worst < 0.01 / 20, f"largest weight difference {worst:.2e}"


@pytest.mark.slow
def test_inplace_relu_at_a_stage_boundary() -> None:
    """torch.distributed.pipelining crashes when a stage starts with ReLU(inplace=True)."""
    result = _results()["inplace"]
    want_params, want_grads = reference_step(_inplace_model(), LENET, 8)
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "all"])
def test_zero_bubble_over_stages_cut_into_segments(recompute: str) -> None:
    result = _results()[f"segmented-{recompute}"]
    want_params, want_grads = reference_step(_segmented_model(), LENET, 8, steps=2)
    # fp32 sums over micro-batches: 1F1B, which cuts nothing, differs from the reference by
    # the same 1e-5 to 4e-5 on the first convolution's bias
    assert_close(merged(result, "grads"), want_grads, rtol=1e-4)
    assert_close(merged(result, "params"), want_params, rtol=1e-4)


@pytest.mark.slow
def test_inference_runs_batch_norm_on_its_running_statistics() -> None:
    """Inference is eval mode: batch norm normalises with its running statistics, so every
    micro-batch of 4 gets what one process in eval mode gives the batch (in training mode
    each would be normalised by its own 4 samples' statistics)."""
    result = _results()["inference-bn"]
    (got,) = [r.outputs for r in result.reports if r.outputs]
    x, _ = synthetic_batch(LENET.spec, 12, seed=0)
    model = _batch_norm_model().eval()
    with torch.no_grad():
        want = model(x)
        trained = _batch_norm_model().train()(x[:4])
    assert torch.allclose(torch.cat(got), want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got[0], trained, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_inference_gives_one_process_outputs() -> None:
    """A forward-only pipeline's outputs, micro-batch by micro-batch, are one process's on
    the same batch (the second step's: seed 1)."""
    result = _results()["inference"]
    got = [r.outputs for r in result.reports if r.outputs]
    assert len(got) == 1 and len(got[0]) == 3
    torch.manual_seed(0)
    x, _ = synthetic_batch(LENET.spec, 12, seed=1)
    with torch.no_grad():
        want = LENET.build()(x)
    assert torch.allclose(torch.cat(got[0]), want, rtol=1e-5, atol=1e-6)
