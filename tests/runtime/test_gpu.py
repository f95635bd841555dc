"""On GPUs (each test skipped where this machine has too few): pipecast's steps, replayed as
CUDA graphs or eager, end at the weights one process reaches on the GPU; every graphed step
after the first replays its graphs; and no run warns (cuBLAS on a thread without a CUDA
context, an empty CUDA graph).

CI has no GPU; these run where one is lent (`python -m pytest tests/runtime/test_gpu.py`),
on one GPU or two. On CPU ranks the engine's side of the graphs is checked against one
process through a stand-in for the graphs (test_graphs.py)."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.helpers import (
    assert_close,
    assert_replayed,
    merged,
    pipeline_job,
    run_all,
    weightless_first,
)

from pipecast.planning.schedules.generators import stages_per_rank
from pipecast.runtime.config import RunConfig
from pipecast.runtime.devices import DTYPES
from pipecast.runtime.job import TrainJob
from pipecast.runtime.run import JobResult
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models.workload import Workload

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
LENET = Workload(model="lenet5", dataset="mnist")
GPT = Workload(model="transformer", dataset="embeddings", seq_len=64, width=64, layers=4, heads=4)
STEPS, BATCH, MICRO = 3, 8, 4

Case = tuple[Workload, str, list[int], bool, dict[str, Any]]
"""The workload, the schedule, the stage boundaries, graphed or eager, more of RunConfig."""
BF16 = {"dtype": "bf16", "autocast": True}
CASES: dict[int, dict[str, Case]] = {
    1: {  # one rank: one stage, or two on it
        "1f1b": (LENET, "1f1b", [0, 12], True, {}),
        "1f1b eager": (LENET, "1f1b", [0, 12], False, {}),
        "zb-v": (LENET, "zb-v", [0, 5, 12], True, {}),
        "interleaved recompute": (LENET, "interleaved", [0, 6, 12], True, {"recompute": "all"}),
        "gpipe bf16": (LENET, "gpipe", [0, 12], True, BF16),
        "zb-v weightless first": (LENET, "zb-v", [0, 1, 4], True, {}),  # a Flatten stage
        # inductor's code inside pipecast's graphs, the split backward's too
        "1f1b compiled": (GPT, "1f1b", [0, 4], True, {"compile": "blocks"}),
        "zb-v compiled": (GPT, "zb-v", [0, 2, 4], True, {"compile": "blocks"}),
        "zb-v compiled eager": (GPT, "zb-v", [0, 2, 4], False, {"compile": "blocks"}),
        # recomputed block by block, the blocks' inputs and the optimizer on the host
        # (pinned copies on streams), the weights streamed in or kept
        "1f1b all offloaded recompute": (
            GPT,
            "1f1b",
            [0, 4],
            False,
            {"offload": "all", "recompute": "all"},
        ),
        "1f1b both offloaded recompute": (
            GPT,
            "1f1b",
            [0, 4],
            False,
            {"offload": "both", "recompute": "all"},
        ),
    },
    2: {
        "gpipe": (LENET, "gpipe", [0, 6, 12], True, {}),
        "1f1b recompute": (LENET, "1f1b", [0, 6, 12], True, {"recompute": "all"}),
        "interleaved": (LENET, "interleaved", [0, 3, 6, 9, 12], True, {}),
        "zb-h1": (LENET, "zb-h1", [0, 5, 12], True, {}),
        "zb-h1 eager": (LENET, "zb-h1", [0, 5, 12], False, {}),
        "zb-v recompute": (LENET, "zb-v", [0, 3, 6, 9, 12], True, {"recompute": "all"}),
        "zb-h1 bf16": (LENET, "zb-h1", [0, 5, 12], True, BF16),
        # rank 0's stage ends in a residual add over a Linear: its backward starts in cuBLAS
        "transformer": (GPT, "zb-h1", [0, 2, 4], True, {}),
    },
}
WEIGHTLESS_FIRST = {"zb-v weightless first"}
"""Cases of the model tests.runtime.helpers.weightless_first (its backward at stage 0 is
empty, which no graph may capture)."""
ALL = [(gpus, name) for gpus, cases in CASES.items() for name in cases]


def _needs(gpus: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(gpus > GPUS, reason=f"needs {gpus} GPU(s), this machine has {GPUS}")


def _job(name: str, case: Case) -> TrainJob:
    workload, schedule, bounds, graphed, extra = case
    model = weightless_first() if name in WEIGHTLESS_FIRST else None
    config = RunConfig(lr=0.1, timeout_s=120, cuda_graphs=graphed, **extra)
    ranks = (len(bounds) - 1) // stages_per_rank(schedule)
    return pipeline_job(
        workload, schedule, ranks, MICRO, bounds, batch=BATCH, steps=STEPS, config=config,
        device="cuda", model=model,
    )  # fmt: skip


@contextlib.contextmanager
def _stderr(into: list[str]) -> Iterator[None]:
    """What this process and the ranks it spawns write to stderr, appended to `into`."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            into.append(f.read().decode(errors="replace"))


@functools.cache
def _results(gpus: int) -> tuple[dict[str, JobResult], str]:
    """The cases for `gpus` GPUs, in one world, and what their ranks wrote to stderr."""
    cases = CASES[gpus]
    printed: list[str] = []
    with _stderr(printed):
        results = run_all([_job(name, case) for name, case in cases.items()])
    return dict(zip(cases, results, strict=True)), printed[0]


def _one_process(name: str, job: TrainJob) -> dict[str, torch.Tensor]:
    """One process on GPU 0: case `name`'s SGD steps on the batches its ranks draw there (a
    GPU draws other numbers than the CPU from a seed), each the sum over the same
    micro-batches, in the job's precision. The model is built afresh (a model handed to the
    ranks may share its memory with them, which trained it)."""
    cfg, device = job.config, torch.device("cuda", 0)
    torch.manual_seed(cfg.seed)
    if name in WEIGHTLESS_FIRST:
        model = weightless_first().to(device)
    else:  # the ranks' weights (TrainJob.exact_init)
        assert job.workload is not None
        model = job.workload.build().to(device)
    dtype = torch.float32 if cfg.autocast else DTYPES[cfg.dtype]
    model = model.to(dtype)
    loss_fn, m = loss_for(job.spec), job.plan.num_microbatches
    for step in range(job.steps):
        model.zero_grad(set_to_none=True)
        seed = cfg.seed + step
        x, y = synthetic_batch(job.spec, job.batch, seed=seed, dtype=dtype, device=device)
        for xm, ym in zip(x.tensor_split(m), y.tensor_split(m), strict=True):
            with torch.autocast("cuda", dtype=DTYPES[cfg.dtype], enabled=cfg.autocast):
                out = model(xm)
            (loss_fn(out, ym) * (len(xm) / job.batch)).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= cfg.lr * p.grad
    return {n: p.detach().float().cpu() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("gpus", "name"), [pytest.param(g, n, marks=_needs(g), id=f"{g}gpu-{n}") for g, n in ALL]
)
def test_steps_on_gpus_end_at_one_process_weights(gpus: int, name: str) -> None:
    result = _results(gpus)[0][name]
    graphed, extra = CASES[gpus][name][3], CASES[gpus][name][4]
    got = {n: t.float() for n, t in merged(result, "params").items()}
    rtol = 1e-2 if extra.get("autocast") else 1e-3 if extra.get("compile") else 1e-4
    assert_close(got, _one_process(name, result.job), rtol=rtol)
    if graphed:
        assert_replayed(result, weightless_first=name in WEIGHTLESS_FIRST)
    else:
        assert all(s.graphs_replayed == 0 for r in result.reports for s in r.steps)


@pytest.mark.parametrize("gpus", [pytest.param(g, marks=_needs(g)) for g in CASES])
def test_runs_on_gpus_print_no_warning(gpus: int) -> None:
    printed = _results(gpus)[1]
    warned = [line for line in printed.splitlines() if "UserWarning" in line]
    assert warned == [], "\n".join(warned)
    assert "CUDA Graph is empty" not in printed
    assert "no current CUDA context" not in printed


FIRST_MATMUL = """
import torch
from pipecast.runtime.backward import backward_input, backward_weights
torch.cuda.set_device(0)
device = torch.device("cuda", 0)
linear = torch.nn.Linear(32, 32, device=device)
x = torch.randn(4, 32, device=device, requires_grad=True)
out = linear(x)  # the backward's first kernel is a matrix product
grad_in, work = backward_input(out, torch.ones_like(out), x, list(linear.parameters()))
backward_weights([work], device)
torch.cuda.synchronize()
print("done")
"""


@_needs(1)
def test_a_backward_starting_in_cublas_finds_a_cuda_context() -> None:
    """In a fresh process (torch warns once per process): autograd's thread for GPU 0 has no
    CUDA context of its own; pipecast binds one before its first backward there."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", FIRST_MATMUL],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    assert "no current CUDA context" not in done.stderr, done.stderr


@_needs(1)
def test_offloaded_copies_under_way_stay_within_the_bound_on_a_gpu() -> None:
    """Eight Linears on a GPU, each saving a 16 MiB input for its backward, offloaded with a
    bound of 8 MiB: a copy is one tensor over the bound, so the forward never lets a second
    one be under way (the most is one input, 16 MiB); and the gradients are those of the
    same model with nothing offloaded."""
    from torch import nn

    from pipecast.runtime.offload import HostActivations

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).to(device)
    x = torch.randn(4096, 1024, device=device, requires_grad=True)
    model(x).square().mean().backward()
    want = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    hooks = HostActivations(device, in_flight=8 * 2**20)
    with hooks.saving():
        out = model(x)
    out.square().mean().backward()
    torch.cuda.synchronize()
    tensor = 4096 * 1024 * 4
    assert hooks.moved_bytes >= 7 * tensor and hooks.most_copying == tensor
    got = [p.grad for p in model.parameters() if p.grad is not None]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@_needs(1)
def test_host_steps_beside_a_gpu_backward_give_one_adams_weights() -> None:
    """Six Linears on a GPU, three micro-batches a step, Adam on the host stepped block by
    block as the gradients leave on their copy stream (runtime.host_step): after three
    steps the weights are those of torch's fused Adam on the GPU over the whole model,
    stepped after the whole backward (fp32; the host's and the GPU's fused kernels round
    alike to a few ulps)."""
    import copy

    from torch import nn

    from pipecast.runtime.host_step import HostStep

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(6)]).to(device)
    ref = copy.deepcopy(model)
    params = list(model.parameters())
    host = [nn.Parameter(p.detach().cpu().pin_memory()) for p in params]
    step = HostStep(
        list(model), params, host,
        lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True), device, streamed=False,
    )  # fmt: skip
    step.overlap = True
    opt = torch.optim.Adam(ref.parameters(), lr=1e-3, fused=True)
    for _ in range(3):
        xs = [torch.randn(256, 512, device=device) for _ in range(3)]
        for i, x in enumerate(xs):
            if i == 2:
                step.last_backward()
            model(x).square().mean().backward()
        assert all(p.grad is None for p in params)  # every gradient left the device
        step.step()
        for x in xs:
            ref(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@_needs(1)
def test_batched_w_on_a_gpu_gives_one_autograd_calls_gradients() -> None:
    """Four micro-batches of 256 rows through two Linears and a LayerNorm on a GPU: their W
    run as one (runtime.weight_batch, from the autograd engine's thread as the runtime runs
    it) gives the weight gradients of one backward over all four."""
    from torch import nn

    from pipecast.runtime.backward import backward_input
    from pipecast.runtime.weight_batch import run_group

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.LayerNorm(1024), nn.Linear(1024, 512))
    model = model.to(device)
    xs = [torch.randn(256, 512, device=device) for _ in range(4)]
    seeds = [torch.randn(256, 512, device=device) for _ in range(4)]
    sum((model(x) * g).sum() for x, g in zip(xs, seeds, strict=True)).backward()  # type: ignore[union-attr]
    want = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    works = []
    for x, g in zip(xs, seeds, strict=True):
        leaf = x.clone().requires_grad_(True)
        works.append([backward_input(model(leaf), g, leaf, list(model.parameters()))[1]])
    run_group(works, device)
    torch.cuda.synchronize()
    got = [p.grad for p in model.parameters()]
    for a, b in zip(got, want, strict=True):
        assert a is not None
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@_needs(1)
def test_a_captured_llama_runs_on_a_gpu_in_bf16_as_hugging_faces_does() -> None:
    """Captured on the host in fp32 (its rotary step moves a buffer to the capture's
    device, its norms cast up and back), moved to a GPU in bf16: the logits of the Hugging
    Face module there in bf16."""
    import copy

    from tests import user_models

    from pipecast.values.data.registry import get_spec
    from pipecast.values.models.capture import capture

    tokens = get_spec("tokens", seq_len=16, vocab=64, width=32)
    torch.manual_seed(0)
    model = user_models.small_llama(tokens)
    reference = copy.deepcopy(model).to("cuda", torch.bfloat16)
    blocks = capture(model, tokens, name="llama").to("cuda", torch.bfloat16)
    x = torch.randint(0, 64, (2, 16), device="cuda")
    torch.testing.assert_close(blocks(x), reference(x), rtol=2e-2, atol=2e-2)


def _fp8_units() -> bool:
    from pipecast.runtime import float8

    return float8.why_not("cuda") is None


@_needs(1)
def test_float8_trains_as_bf16_does_over_50_steps() -> None:
    """A GPT of width 256 (Linears of multiples of 16) trained 50 steps with Adam on the same
    batches, once in bf16 and once with Float8 Linears, both compiled: over the last 10
    steps Float8's mean loss lies within bf16's own spread there (three standard deviations
    of its steps' losses) of bf16's mean."""
    if not _fp8_units():
        pytest.skip("needs a GPU with FP8 matrix units and torchao")
    import statistics

    from pipecast.api import make_job
    from pipecast.runtime.run import run_job

    workload = Workload(model="gpt", dataset="tokens", width=256, layers=4, heads=4, seq_len=256)
    losses: dict[bool, list[float]] = {}
    for f8 in (False, True):
        config = RunConfig(dtype="bf16", optimizer="adam", lr=1e-3, compile="blocks", float8=f8)
        job, _ = make_job(
            workload, gpus=1, microbatches=1, batch=16, partition="0,6", steps=50,
            warmup_steps=0, device="cuda", config=config,
        )  # fmt: skip
        result = run_job(job)
        assert result is not None
        losses[f8] = [s.loss for r in result.reports for s in r.steps if s.loss is not None]
    assert len(losses[False]) == len(losses[True]) == 50
    tail = {f8: values[-10:] for f8, values in losses.items()}
    spread = 3 * statistics.stdev(tail[False])
    assert abs(statistics.mean(tail[True]) - statistics.mean(tail[False])) <= spread
    assert statistics.mean(tail[False]) < losses[False][0]  # it learned
