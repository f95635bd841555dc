"""A model whose embedding and head share one weight (tests/runtime/tied_lm.py), trained on
CPU ranks with that weight's copies on two ranks, on one rank in two stages, over
data-parallel replicas and streamed from the host in one stage: the weights and the clipped
global norm are those of one process (torch.nn.utils.clip_grad_norm_)."""

from __future__ import annotations

import functools

import pytest
import torch
from tests.runtime.helpers import assert_close, pipeline_job, run_all

from pipecast.runtime.config import RunConfig
from pipecast.runtime.run import JobResult
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload

TIED = Workload(model="tests.runtime.tied_lm:tied_lm", dataset="tokens", seq_len=8, vocab=32)
STEPS, MICRO, LR, CLIP = 2, 4, 0.1, 0.05
CLIPPED = RunConfig(lr=LR, timeout_s=60, clip_grad_norm=CLIP)
STREAMED = RunConfig(lr=LR, timeout_s=60, offload="weights")
# name: schedule, ranks, boundaries, replicas, config
CASES = {
    "two ranks": ("1f1b", 2, [0, 5, 10], 1, CLIPPED),  # embedding on rank 0, head on rank 1
    "one rank, two stages": ("zb-v", 2, [0, 3, 5, 8, 10], 1, CLIPPED),  # both on rank 0
    "replicas": ("1f1b", 2, [0, 5, 10], 2, CLIPPED),
    "streamed": ("1f1b", 1, [0, 10], 1, STREAMED),  # both in one stage, streamed
}


@functools.cache
def _results() -> dict[str, JobResult]:
    jobs = [
        pipeline_job(
            TIED, schedule, ranks, MICRO, bounds, batch=8 * replicas, steps=STEPS,
            replicas=replicas, config=config,
        )
        for schedule, ranks, bounds, replicas, config in CASES.values()
    ]  # fmt: skip
    return dict(zip(CASES, run_all(jobs), strict=True))


def _reference(batch: int, clip: float) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process on one thread (as each CPU rank runs), SGD steps on the pipeline's batches,
    each the sum over the same micro-batches: the weights under every name the tied one goes
    by, and the gradient norm of each step before clipping (with `clip` > 0)."""
    torch.manual_seed(0)
    model = TIED.build()
    loss = loss_for(TIED.spec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    norms = []
    try:
        for step in range(STEPS):
            model.zero_grad(set_to_none=True)
            x, y = synthetic_batch(TIED.spec, batch, seed=step)
            for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO), strict=True):
                (loss(model(xs), ys) / MICRO).backward()
            if clip > 0:
                norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= LR * p.grad
    finally:
        torch.set_num_threads(threads)
    named = model.named_parameters(remove_duplicate=False)
    return {n: p.detach().clone() for n, p in named}, norms


def test_the_model_ties_its_first_and_last_block() -> None:
    from pipecast.runtime import ties

    assert list(ties.holders(TIED.build())) == ["head.weight"]
    assert [b for b, _ in ties.holders(TIED.build())["head.weight"]] == [0, 9]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_tied_model_trains_as_one_process(case: str) -> None:
    result = _results()[case]
    _, _, _, replicas, config = CASES[case]
    want, norms = _reference(result.job.batch, config.clip_grad_norm)
    if norms:
        assert min(norms) > CLIP  # the clipping is doing something
        for step, norm in enumerate(norms):
            seen = {s.grad_norm for r in result.reports for s in r.steps if s.step == step}
            assert len(seen) == 1, seen  # every rank clipped by the same norm
            assert seen.pop() == pytest.approx(norm, rel=1e-5), f"step {step}"
    for replica in range(replicas):
        got = {k: v for r in result.reports if r.replica == replica for k, v in r.params.items()}
        assert len(got) == len(want) - (case == "streamed")  # one stage holds the tie once
        assert_close(got, {k: want[k] for k in got})
