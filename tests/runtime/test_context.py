"""Context parallelism (pipecast.runtime.context): the load-balanced chunks and their causal
mask against full causal attention in one process, and the zoo's GPT trained over context
ranks on gloo to the weights one process reaches on the same batches."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tests.runtime.helpers import merged, pipeline_job, reference_step, run_all

from pipecast.errors import ConfigError
from pipecast.runtime import context
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload

GPT = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=64, width=32, layers=2, heads=4)
BATCH, STEPS = 4, 2


def test_each_rank_holds_an_early_and_the_mirrored_late_chunk() -> None:
    """Llama 3's split of 8 positions over 2 ranks (chunks of 2): rank 0 the first and the
    last chunk, rank 1 the two middle ones; over 4 ranks, chunks of 1."""
    assert context.positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert context.positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert [context.positions(8, 4, r).tolist() for r in range(4)] == [
        [0, 7],
        [1, 6],
        [2, 5],
        [3, 4],
    ]
    # a causal mask gives each rank the same number of (query, key) pairs: balanced
    counts = {int(context.mask(16, 4, r).sum()) for r in range(4)}
    assert counts == {34}  # rank r: (2r+1)+(2r+2) early, (15-2r)+(16-2r) late


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_attention_over_the_gathered_chunks_is_full_causal_attention(degree: int) -> None:
    """Every rank's output rows are those of causal attention over the whole sequence in one
    process, and so are the gradients of its queries and of every key and value."""
    torch.manual_seed(0)
    seq = 4 * degree
    q, k, v = (torch.randn(2, 3, seq, 5, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    weights = torch.randn_like(full)
    want = torch.autograd.grad((full * weights).sum(), (q, k, v))
    got = [torch.zeros_like(t) for t in (q, k, v)]
    for rank in range(degree):
        mine = context.positions(seq, degree, rank)
        held = [context.positions(seq, degree, r) for r in range(degree)]
        out = context.attend_gathered(
            q[:, :, mine], [k[:, :, p] for p in held], [v[:, :, p] for p in held], rank=rank
        )
        torch.testing.assert_close(out, full[:, :, mine])
        grads = torch.autograd.grad((out * weights[:, :, mine]).sum(), (q, k, v))
        got = [g + d for g, d in zip(got, grads, strict=True)]  # the reduce-scatter's sums
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def _job(stages: int, microbatches: int, *, replicas: int = 1, cp: int = 2) -> TrainJob:
    bounds = [0, 4] if stages == 1 else [0, 2, 4]
    job = pipeline_job(
        GPT,
        "1f1b",
        stages,
        microbatches,
        bounds,
        batch=BATCH,
        replicas=replicas,
        steps=STEPS,
        config=RunConfig(lr=0.1, timeout_s=120),
    )
    return replace(job, cp=cp)


CLIP = 0.5
"""A global gradient norm to clip to, below the GPT's first gradients' (about 3)."""

CASES = {
    "CP x2, accumulate 2": _job(1, 2),
    "CP x2, clipped": replace(
        _job(1, 1), config=RunConfig(lr=0.1, timeout_s=120, clip_grad_norm=CLIP)
    ),
    "1f1b 2 stages x CP x2": _job(2, 2),
    "data parallel x2 x CP x2": _job(1, 1, replicas=2),
}


@pytest.fixture(scope="module")
def results() -> dict[str, object]:
    names = list(CASES)
    return dict(zip(names, run_all([CASES[n] for n in names]), strict=True))


def _clipped_reference() -> dict[str, torch.Tensor]:
    """One process's SGD steps, the gradients clipped to CLIP by torch's own function."""
    model = GPT.build()
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        x, y = synthetic_batch(GPT.spec, BATCH, seed=step)
        loss_for(GPT.spec)(model(x), y).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        assert norm > CLIP  # the clip bites
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad  # type: ignore[operator]
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", list(CASES))
def test_context_parallel_trains_to_one_process_weights(
    case: str, results: dict[str, object]
) -> None:
    torch.manual_seed(0)
    if CASES[case].config.clip_grad_norm:
        want = _clipped_reference()
    else:
        want, _ = reference_step(GPT.build(), GPT, BATCH, lr=0.1, steps=STEPS)
    got = merged(results[case], "params")  # type: ignore[arg-type]
    for name, ref in want.items():
        torch.testing.assert_close(got[name], ref, rtol=1e-5, atol=1e-6, msg=name)
    assert set(got) == set(want)
    # the loss reported is the mean over every token of replica 0's share of the first
    # step's batch (as data parallelism reports it), not one context rank's tokens
    torch.manual_seed(0)
    x, y = synthetic_batch(GPT.spec, BATCH, seed=0)
    share = BATCH // CASES[case].replicas
    with torch.no_grad():
        first = float(loss_for(GPT.spec)(GPT.build()(x[:share]), y[:share]))
    reported = [
        r.steps[0].loss
        for r in results[case].reports  # type: ignore[attr-defined]
        if r.steps[0].loss is not None
    ]
    assert reported
    assert reported[0] == pytest.approx(first, rel=1e-5)


def test_context_parallel_refuses_what_it_cannot_split() -> None:
    """One line each, before anything starts: a sequence that does not cut into 2 x degree
    chunks, a model with no causal attention over a sequence."""
    with pytest.raises(ConfigError, match="does not divide by 6"):
        replace(CASES["CP x2, accumulate 2"], cp=3).check()
    lenet = Workload(model="lenet5", dataset="mnist")
    stack = Workload(model="transformer", dataset="embeddings", seq_len=8, width=32, layers=2)
    for other in (lenet, stack):  # no sequence; attention the runtime cannot reach
        job = pipeline_job(other, "1f1b", 1, 1, [0, other.block_count()], batch=8)
        with pytest.raises(ConfigError, match="has none"):
            replace(job, cp=2).check()
    with pytest.raises(ConfigError, match="tensor parallelism"):
        replace(CASES["CP x2, accumulate 2"], tp=2).check()
