"""Compiled stages (pipecast.runtime.compiled) against one eager process.

Inductor compiles on the CPU with the machine's C++ compiler, seconds a graph: the models
here are small and made of identical blocks, so one compiled graph serves most of them, and
every job of the module runs in one spawned world (helpers.run_all) sharing inductor's
on-disk cache with the in-process tests. That cache is the one pipecast's runs use
(compiled.use_cache: TORCHINDUCTOR_CACHE_DIR, else the user's): a graph compiled by an
earlier run is read back, as a user's second run reads it, and one whose code changed (its
graph, pipecast's split of it, torch's version) is compiled again. Point
TORCHINDUCTOR_CACHE_DIR at an empty folder for a run that compiles everything.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import pytest
import torch
import torch.fx as fx
from tests.runtime.helpers import (
    assert_close,
    assert_replayed,
    merged,
    pipeline_job,
    reference_step,
    run_all,
)
from tests.user_models import MlpBlock
from torch import nn

from pipecast.runtime import compiled, graphs
from pipecast.runtime.compile_split import split_backward
from pipecast.runtime.config import RunConfig
from pipecast.runtime.run import JobResult
from pipecast.values.models import Workload

MODEL = Workload(model="tests.user_models:residual_mlp", dataset="mnist")
WIDTH = 24


@pytest.fixture(autouse=True, scope="module")
def _shared_cache() -> Iterator[None]:
    """One inductor cache for the module's processes, pipecast's own: spawned ranks find
    what the first compile of each graph wrote, this run's or an earlier one's."""
    mp = pytest.MonkeyPatch()
    mp.setenv(
        compiled.CACHE_ENV, os.environ.get(compiled.CACHE_ENV) or str(compiled.default_cache_dir())
    )
    mp.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    yield
    mp.undo()


def test_split_backward_computes_each_node_once_and_matches_the_whole() -> None:
    """dI then dW give the whole backward's outputs, and no operation runs in both."""
    seen: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, _: list[torch.Tensor]) -> fx.GraphModule:
        seen.append(gm)
        return gm

    from functorch.compile import aot_function, make_boxed_compiler

    block = MlpBlock(WIDTH)
    params = [p.detach().requires_grad_(True) for p in block.parameters()]
    names = [n for n, _ in block.named_parameters()]

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.func.functional_call(
            block, dict(zip(names, ps, strict=True)), (x,)
        )
        return out

    fn = aot_function(
        f, fw_compiler=make_boxed_compiler(keep), bw_compiler=make_boxed_compiler(keep)
    )
    x = torch.randn(4, WIDTH, requires_grad=True)
    fn(x, *params).sum().backward()
    bw = seen[-1]
    parts = split_backward(bw, [0])
    ops = lambda gm: {n.name for n in gm.graph.nodes if n.op == "call_function"}  # noqa: E731
    assert ops(parts.di) and ops(parts.dw) and not ops(parts.di) & ops(parts.dw)
    args = [torch.randn(n.meta["val"].shape) for n in bw.graph.nodes if n.op == "placeholder"]
    whole = bw(*args)
    first = parts.di(*args)
    weights = parts.dw(*[args[i] for i in parts.dw_args], *first[len(parts.input_grads) :])
    assert parts.input_grads == (0,) and len(parts.weight_grads) == len(params)
    torch.testing.assert_close(first[0], whole[0])
    for position, grad in zip(parts.weight_grads, weights, strict=True):
        torch.testing.assert_close(grad, whole[position])


def test_a_compiled_block_leaves_its_weight_gradients_for_w() -> None:
    """Inside `splitting()` a compiled block gives its input's gradient and no weight's; W
    then adds exactly the eager gradients."""
    torch.manual_seed(0)
    eager, block = MlpBlock(WIDTH), MlpBlock(WIDTH)
    block.load_state_dict(eager.state_dict())
    compiled.compile_blocks(nn.Sequential(block), split=True)
    x, g = torch.randn(3, 5, WIDTH), torch.randn(3, 5, WIDTH)
    x_eager = x.clone().requires_grad_(True)
    eager(x_eager).backward(g)
    x_in = x.clone().requires_grad_(True)
    out = block(x_in)
    with compiled.splitting() as pending:
        (grad_in,) = torch.autograd.grad(out, x_in, g)
    assert len(pending) == 1 and all(p.grad is None for p in block.parameters())
    torch.testing.assert_close(grad_in, x_eager.grad)
    pending[0].run()
    for mine, want in zip(block.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, want.grad)


CASES = {
    "gpipe": ("gpipe", 2, 4, [0, 4, 8], {}),
    "1f1b": ("1f1b", 2, 4, [0, 4, 8], {}),
    "interleaved": ("interleaved", 2, 4, [0, 2, 4, 6, 8], {}),
    "zb-h1": ("zb-h1", 2, 4, [0, 4, 8], {}),
    "zb-v": ("zb-v", 2, 4, [0, 2, 4, 6, 8], {}),
    "zb-h1-weight-batch": ("zb-h1", 2, 4, [0, 4, 8], {"weight_batch": 2}),
    "zb-h1-recompute": ("zb-h1", 2, 4, [0, 4, 8], {"recompute": "all"}),
    "zb-h1-budget": ("zb-h1", 2, 4, [0, 4, 8], {"compile_budget": 0.5}),
    "zb-h1-offload": ("zb-h1", 2, 4, [0, 4, 8], {"offload": "activations"}),
    "1f1b-stage": ("1f1b", 2, 4, [0, 4, 8], {"compile": "stage"}),
    "zb-h1-graphed": ("zb-h1", 2, 4, [0, 4, 8], {"cuda_graphs": True}),
}
STEPS = 3  # graphed: the first eager, then two replays


@functools.cache
def _results() -> dict[str, JobResult]:
    jobs = []
    for schedule, ranks, m, bounds, extra in CASES.values():
        options = {"compile": "blocks", "lr": 0.1, "timeout_s": 120, **extra}
        weight_batch = int(options.pop("weight_batch", 1))
        config = RunConfig(**options)  # type: ignore[arg-type]
        jobs.append(
            pipeline_job(
                MODEL, schedule, ranks, m, bounds, batch=8, steps=STEPS, config=config,
                weight_batch=weight_batch,
            )
        )  # fmt: skip
    results = run_all(jobs, env={graphs.STAND_IN_ENV: "1"})
    return dict(zip(CASES, results, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_schedules_train_to_one_process_weights(case: str) -> None:
    result = _results()[case]
    torch.manual_seed(0)
    want_params, want_grads = reference_step(MODEL.build(), MODEL, 8, steps=STEPS, lr=0.1)
    assert_close(merged(result, "grads"), want_grads, rtol=1e-4)
    assert_close(merged(result, "params"), want_params, rtol=1e-4)
    schedule, _, m, _, extra = CASES[case]
    split = schedule.startswith("zb")
    for report in result.reports:
        counts = report.compiled
        assert counts["blocks"] >= 1, report.global_rank  # every stage runs compiled code
        # each micro-batch of each stage ran its compiled backward; a split one left its W
        splits = split and report.stages != [0]  # the first stage's B is its whole backward
        backwards = counts["split"] if splits else counts["whole"]
        assert backwards >= m * STEPS, (report.global_rank, counts)
        if splits:
            assert counts["weights"] >= m * STEPS, (report.global_rank, counts)
    if extra.get("cuda_graphs"):
        assert_replayed(result)


def test_blocks_of_torchs_own_modules_all_run_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks that are torch's own modules (Conv2d, Linear: a VGG's) all enter dynamo
    through one wrapper function, whose graphs count against one recompile limit: each
    block compiled has a budget of RECOMPILE_LIMIT graphs of its own, or the blocks past
    the shared limit run eagerly (dynamo only warns). Here a limit of 2 and three Linears
    at two micro-batch sizes: 6 graphs on that one function."""
    calls = [0]

    def backend(gm: fx.GraphModule, _: list[object]) -> object:
        def run(*args: object) -> object:
            calls[0] += 1
            return gm.forward(*args)

        return run

    dynamo = torch._dynamo.config
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 2)
    monkeypatch.setattr(compiled, "_BACKENDS", {(False, 1.0): backend})
    monkeypatch.setattr(compiled, "_COMPILED_BLOCKS", [0])
    monkeypatch.setattr(dynamo, "recompile_limit", 2)
    monkeypatch.setattr(dynamo, "accumulated_recompile_limit", 2)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(4, 8))
    compiled.compile_blocks(model, split=False)
    try:
        for size in (1, 2):
            before = calls[0]
            model(torch.randn(size, 8)).sum().backward()
            assert calls[0] - before == 3, f"micro-batch {size}: blocks ran eagerly"
    finally:
        torch._dynamo.reset()
