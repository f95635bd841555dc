"""Recomputation (runtime/recompute.py): what a recomputed forward keeps, read from the
tensors it leaves alive; when FSDP's stages run their forwards again, read from hooks on
the blocks on two gloo CPU ranks; and that every way of recomputing trains to the weights
one process reaches on the same batches."""

from __future__ import annotations

import contextlib
import gc
import weakref
from dataclasses import replace
from typing import Any

import pytest
import torch
from tests.runtime.helpers import (
    OpCounts,
    assert_close,
    merged,
    pipeline_job,
    reference_step,
    run_all,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from pipecast.errors import ConfigError
from pipecast.runtime.config import RunConfig
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.recompute import context_fn
from pipecast.runtime.sharding import build_mesh
from pipecast.runtime.stage import StageModule
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload
from pipecast.values.models.gpt import Block
from pipecast.values.parallel import Layout

GPT = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=64, width=32, layers=2, heads=4)
BATCH, STEPS = 8, 2


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensors the ops inside it made that are still alive when asked (each
    storage once): what a forward leaves for its backward, wherever it is kept (autograd's
    saved tensors, or selective checkpointing's own store, which saved_tensors_hooks do not
    see)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[weakref.ref[torch.Tensor], int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self.made.append((weakref.ref(t), storage.data_ptr(), storage.nbytes()))
        return out

    def alive(self, *but: torch.Tensor) -> int:
        gc.collect()
        skip = {t.untyped_storage().data_ptr() for t in but}
        alive = {ptr: n for ref, ptr, n in self.made if ref() is not None and ptr not in skip}
        return sum(alive.values())


def _kept_and_grads(recompute: str) -> tuple[int, list[torch.Tensor]]:
    """A GPT block's forward under `recompute` (as one checkpoint, as a stage runs it): the
    bytes it keeps beyond its output, and its gradients."""
    torch.manual_seed(0)
    block = Block(32, 4)
    x = torch.randn(4, 16, 32, requires_grad=True)
    with LiveBytes() as live:
        if recompute == "none":
            y = block(x)
        else:
            y = checkpoint(block, x, use_reentrant=False, context_fn=context_fn(recompute))
    kept = live.alive(y)
    y.square().sum().backward()
    assert x.grad is not None
    return kept, [x.grad, *(p.grad for p in block.parameters() if p.grad is not None)]


def test_selective_keeps_less_than_none_and_more_than_all_for_the_same_gradients() -> None:
    """Selective keeps the projections' and the attention's outputs (4 of width, 1 of 4 x
    width for the MLP's up and 1 for its down, the attention's output and log-sum-exp):
    less than all a block saves (the norms', GELU's, the residual sums' too), more than
    nothing; its gradients are those of no recomputation."""
    none, want = _kept_and_grads("none")
    selective, got = _kept_and_grads("selective")
    full, _ = _kept_and_grads("all")
    assert full == 0  # the input is the caller's
    assert 0 < selective < none
    # by hand: b x t = 64 rows of fp32; q, k, v, proj and down of width 32, up of 128, the
    # attention's output (32) and its log-sum-exp (one per row and head: 4)
    rows = 4 * 16
    assert selective == rows * 4 * (5 * 32 + 128 + 32 + 4)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def _on_rank(ctx: Context) -> dict[str, Any]:
    """A GPT stage sharded over both ranks (FSDP, resharded after the forward), trained one
    micro-batch without and with recomputation: the order in which its blocks' forwards and
    backwards run in the backward, and the all-gathers that backward issues."""
    mesh = build_mesh(ctx.device, Layout(replicas=2, pipeline=1), "full")
    out: dict[str, Any] = {}
    for recompute in ("none", "all", "selective"):
        torch.manual_seed(0)
        config = RunConfig(recompute=recompute)  # type: ignore[arg-type]
        st = StageModule(0, GPT.build(), ctx.device, config, first=True, last=True, mesh=mesh)
        out[recompute] = _backward_order(st, recompute != "none")
    return out


def _backward_order(st: StageModule, recompute: bool) -> tuple[list[str], int]:
    """The order in which a GPT stage's blocks run their forwards (F, again where
    recomputed) and begin their backwards (B) in the backward of one micro-batch, and the
    all-gathers that backward issues."""
    order: list[str] = []
    for i, block in enumerate(st.module):
        inner = next(iter(block.children()))  # runs again in a recomputed forward
        inner.register_forward_hook(lambda *_, i=i: order.append(f"F{i}"))
        block.register_full_backward_pre_hook(lambda *_, i=i: order.append(f"B{i}"))
    x, y = synthetic_batch(GPT.spec, 4, seed=0)
    out = st.forward(x, recompute=recompute)
    order.clear()
    with OpCounts() as ops:
        loss_for(GPT.spec)(out, y).backward()
    return order, ops.ops["_allgather_base_"] + ops.ops["all_gather_into_tensor"]


BLOCK_BY_BLOCK = [e for i in reversed(range(4)) for e in (f"B{i}", f"F{i}")]
"""Each of a GPT stage's four blocks recomputed as its backward begins."""


@pytest.mark.parametrize("recompute", ["selective", "all"])
def test_a_whole_model_stage_reruns_one_block_at_a_time(recompute: str) -> None:
    """Whole weights, selective, or all of the whole model (one stage, as pricing.py
    prices it): each block a checkpoint, not the stage one, whose backward would hold every
    activation again."""
    torch.manual_seed(0)
    config = RunConfig(recompute=recompute)  # type: ignore[arg-type]
    st = StageModule(0, GPT.build(), torch.device("cpu"), config, first=True, last=True)
    assert _backward_order(st, recompute=True)[0] == BLOCK_BY_BLOCK


def test_a_pipeline_stage_recomputes_as_one_checkpoint() -> None:
    """A stage of a pipeline (not the whole model) reruns its whole forward as its last
    block's backward begins: one checkpoint, what GPipe does and the simulator prices."""
    torch.manual_seed(0)
    st = StageModule(0, GPT.build(), torch.device("cpu"), RunConfig(recompute="all"),
                     first=True, last=False)  # fmt: skip
    order = _backward_order_of_output(st)
    assert order == ["B3", *(f"F{i}" for i in range(4)), "B2", "B1", "B0"]


def _backward_order_of_output(st: StageModule) -> list[str]:
    """_backward_order for a stage without the loss: the backward of its output's sum."""
    order: list[str] = []
    for i, block in enumerate(st.module):
        inner = next(iter(block.children()))
        inner.register_forward_hook(lambda *_, i=i: order.append(f"F{i}"))
        block.register_full_backward_pre_hook(lambda *_, i=i: order.append(f"B{i}"))
    x, _ = synthetic_batch(GPT.spec, 4, seed=0)
    out = st.forward(x, recompute=True)
    order.clear()
    out.float().square().sum().backward()
    return order


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = spawn(_on_rank, 2, timeout_s=60)
    return got


def test_fsdp_recomputes_each_block_just_before_its_backward(
    ranks: list[dict[str, Any]],
) -> None:
    """Under FSDP each block runs its forward again as the backward reaches it, so the
    backward holds one block's recomputed activations at a time (one checkpoint around the
    sharded stage would rerun all four first: the memory of not recomputing at all)."""
    blocks = 4
    for rank in ranks:
        order, _ = rank["none"]
        assert order == [f"B{i}" for i in reversed(range(blocks))]
        for recompute in ("all", "selective"):
            order, _ = rank[recompute]
            assert order == BLOCK_BY_BLOCK


def test_fsdp_gathers_no_more_for_a_recomputed_backward(ranks: list[dict[str, Any]]) -> None:
    """Resharded after the forward, the backward gathers each unit but the last once again,
    recomputed or not: the recomputed forward runs on the backward's gather (what the
    simulator prices, planning/simulation/sharded.py)."""
    for rank in ranks:
        assert rank["none"][1] == rank["all"][1] == rank["selective"][1] == 3


def _job(stages: int, microbatches: int, recompute: str, **mesh: Any) -> Any:
    bounds = [0, 4] if stages == 1 else [0, 2, 4]
    job = pipeline_job(
        GPT,
        "1f1b",
        stages,
        microbatches,
        bounds,
        batch=BATCH,
        replicas=mesh.pop("replicas", 1),
        steps=STEPS,
        config=RunConfig(lr=0.1, timeout_s=120, recompute=recompute),  # type: ignore[arg-type]
    )
    return replace(job, **mesh)


CASES = {
    "FSDP x2, recompute all": _job(1, 2, "all", replicas=2, shard="full"),
    "FSDP x2, all but last": _job(1, 2, "all-but-last", replicas=2, shard="full"),
    "FSDP x2, selective": _job(1, 2, "selective", replicas=2, shard="full"),
    "FSDP x2 x 1f1b 2 stages, all": _job(2, 2, "all", replicas=2, shard="grad"),
    "1f1b 2 stages, selective": _job(2, 2, "selective"),
}


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    names = list(CASES)
    return dict(zip(names, run_all([CASES[n] for n in names]), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_recomputed_training_reaches_one_process_weights(
    case: str, results: dict[str, Any]
) -> None:
    torch.manual_seed(0)
    want, _ = reference_step(GPT.build(), GPT, BATCH, lr=0.1, steps=STEPS)
    assert_close(merged(results[case], "params"), want)


def test_selective_refuses_offloaded_activations() -> None:
    with pytest.raises(ConfigError, match="selective"):
        RunConfig(recompute="selective", offload="activations")
    with pytest.raises(ConfigError, match="unknown recomputation"):
        RunConfig(recompute="some")  # type: ignore[arg-type]


def test_offloaded_activations_of_a_recomputed_model_are_its_blocks_inputs() -> None:
    """The whole model recomputed block by block under the activations' hooks: what moves
    to the host is each checkpoint's input (the tokens, then each block's output but the
    last's: 3 x 4 x 8 x 32 fp32, the embedding's and the two decoder blocks', the head
    being last), not what the blocks save; the gradients are those of nothing moved."""
    from pipecast.runtime.offload import HostActivations

    def run(offload: bool) -> tuple[int, list[torch.Tensor]]:
        torch.manual_seed(0)
        st = StageModule(0, GPT.build(), torch.device("cpu"), RunConfig(recompute="all"),
                         first=True, last=True)  # fmt: skip
        x, y = synthetic_batch(GPT.spec, 4, seed=0)
        host = HostActivations(torch.device("cpu"))
        hooks = torch.autograd.graph.saved_tensors_hooks(host.pack, host.unpack)
        with hooks if offload else contextlib.nullcontext():
            out = st.forward(x, recompute=True)
        loss_for(GPT.spec)(out, y).backward()
        return host.moved_bytes, [p.grad for p in st.params if p.grad is not None]

    moved, got = run(True)
    _, want = run(False)
    tokens = 4 * 8 * 8  # int64
    block_out = 4 * 8 * 32 * 4
    assert moved == tokens + 3 * block_out
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
