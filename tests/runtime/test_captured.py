"""Captured models (a plain-nn.Module residual network, a Hugging Face GPT-2 with its
embedding and head tied) trained on CPU ranks equal one process of the same blocks."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, run_all

from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload

RESIDUAL = Workload(model="tests.user_models:short_residual_net", dataset="mnist")
DECODER = Workload(model="tests.user_models:small_decoder", dataset="tokens", seq_len=16, vocab=64)
CASES = [
    (RESIDUAL, "gpipe", [0, 3, 8]),  # the cut passes two tensors, packed
    (RESIDUAL, "1f1b", [0, 4, 8]),
    (RESIDUAL, "zb-h1", [0, 3, 8]),
    (DECODER, "gpipe", [0, 6, 12]),  # embedding on rank 0, tied head on rank 1
    (DECODER, "1f1b", [0, 5, 12]),
    (DECODER, "zb-h1", [0, 7, 12]),
    (DECODER, "zb-v", [0, 3, 6, 9, 12]),  # both tied copies on rank 0, in two stages
]
STEPS, BATCH, MICRO, LR = 2, 8, 4, 0.1


Reference = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]


def _reference(workload: Workload) -> Reference:
    """One process, SGD steps on the pipeline's batches, each a sum over the same four
    micro-batches, on one thread as each CPU rank runs (a full batch, or two threads, round a
    conv bias's gradient differently by about 2e-5), with every name a tied parameter goes
    by; and how many distinct parameters the model has."""
    torch.manual_seed(0)
    model = workload.build()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        params, grads = _steps(model, workload)
    finally:
        torch.set_num_threads(threads)
    return params, grads, len(list(model.parameters()))


def _steps(
    model: torch.nn.Sequential, workload: Workload
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    loss = loss_for(workload.spec)
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        x, y = synthetic_batch(workload.spec, BATCH, seed=step)
        for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO), strict=True):
            (loss(model(xs), ys) / MICRO).backward()
        grads = {id(p): p.grad.clone() for p in model.parameters() if p.grad is not None}
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= LR * p.grad
    named = dict(model.named_parameters(remove_duplicate=False))
    return (
        {n: p.detach().clone() for n, p in named.items()},
        {n: grads[id(p)] for n, p in named.items()},
    )


@pytest.mark.slow
def test_captured_models_train_as_one_process() -> None:
    jobs = [
        pipeline_job(
            workload,
            schedule,
            2,
            MICRO,
            bounds,
            batch=BATCH,
            steps=STEPS,
        )
        for workload, schedule, bounds in CASES
    ]
    results = run_all(jobs)
    references = {w.model: _reference(w) for w in (RESIDUAL, DECODER)}
    for (workload, schedule, _), result in zip(CASES, results, strict=True):
        want_params, want_grads, unique = references[workload.model]
        got_params, got_grads = merged(result, "params"), merged(result, "grads")
        assert got_params, schedule
        assert len(got_params) >= unique
        assert_close(got_params, {k: want_params[k] for k in got_params})
        assert_close(got_grads, {k: want_grads[k] for k in got_grads})
