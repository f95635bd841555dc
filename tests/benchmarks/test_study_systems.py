"""The studies' own systems as bench baselines (benchmarks/study_systems.py): each must
compute what one process computes on the same batch, or its timings compare nothing."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from benchmarks.study_systems import counts, deepspeed_engine, torchgpipe_model

from pipecast.orchestration.bench.baselines import build
from pipecast.runtime.launch import Context, spawn
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models.workload import Workload

LENET = Workload(model="lenet5", dataset="mnist")
has = {name: importlib.util.find_spec(name) is not None for name in ("torchgpipe", "deepspeed")}


def _one_process_step(batch: int, model: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = model or build(LENET, torch.device("cpu"), "fp32")
    x, y = synthetic_batch(LENET.spec, batch, seed=0, dtype=torch.float32)
    torch.autograd.backward(loss_for(LENET.spec)(model(x), y))
    torch.optim.SGD(model.parameters(), lr=1e-4).step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_counts_turns_a_split_into_blocks_per_partition() -> None:
    assert counts([0, 3, 4, 12]) == [3, 1, 8]


@pytest.mark.skipif(not has["torchgpipe"], reason="torchgpipe is not installed")
@pytest.mark.parametrize(("recompute", "balance"), [("none", ""), ("all-but-last", "time")])
def test_torchgpipe_step_equals_one_process(recompute: str, balance: str) -> None:
    torch.manual_seed(0)
    model = build(LENET, torch.device("cpu"), "fp32", inplace=False)
    x, y = synthetic_batch(LENET.spec, 16, seed=0, dtype=torch.float32)
    cpu = [torch.device("cpu")] * 2
    wrapped, got = torchgpipe_model(
        model, x, cpu, microbatches=4, boundaries=None if balance else [0, 5, len(model)],
        balance=balance, recompute=recompute,
    )  # fmt: skip
    assert len(got) == 2 and sum(got) == len(model) and min(got) >= 1
    torch.autograd.backward(loss_for(LENET.spec)(wrapped(x), y))
    torch.optim.SGD(wrapped.parameters(), lr=1e-4).step()
    want = _one_process_step(16)
    got_state = model.state_dict()  # GPipe moved these very blocks into its partitions
    assert sorted(got_state) == sorted(want)
    for name, value in got_state.items():
        torch.testing.assert_close(value, want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not has["torchgpipe"], reason="torchgpipe is not installed")
@pytest.mark.parametrize(("recompute", "forwards"), [("none", 4), ("all-but-last", 7), ("all", 8)])
def test_torchgpipe_recomputes_what_pipecast_would(recompute: str, forwards: int) -> None:
    """Each block runs once per micro-batch (4) in the forward, and again in the backward
    for each micro-batch it recomputes: none, all but the last, or all of them."""
    torch.manual_seed(0)
    model = build(LENET, torch.device("cpu"), "fp32", inplace=False)
    x, y = synthetic_batch(LENET.spec, 16, seed=0, dtype=torch.float32)
    calls = [0, 0]
    for i, block in enumerate((model[0], model[len(model) - 1])):  # one in each partition
        block.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    wrapped, _ = torchgpipe_model(
        model, x, [torch.device("cpu")] * 2, microbatches=4, boundaries=[0, 5, len(model)],
        balance="", recompute=recompute,
    )  # fmt: skip
    torch.autograd.backward(loss_for(LENET.spec)(wrapped(x), y))
    assert calls == [forwards, forwards]


def _deepspeed_rank(ctx: Context) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """This rank's stage weights before and after one DeepSpeed step, by the whole model's
    parameter names."""
    engine = deepspeed_engine(ctx, LENET, 16, [0, 5, len(LENET.build("meta"))],
                              microbatches=4, dtype="fp32")  # fmt: skip
    first = 0 if ctx.rank == 0 else 5  # DeepSpeed names parameters by its layer index

    def state() -> dict[str, torch.Tensor]:
        out = {}
        for name, value in engine.module.state_dict().items():
            layer, block, rest = name.split(".", 2)
            assert int(layer) == ctx.rank
            out[f"{first + int(block)}.{rest}"] = value.detach().clone()
        return out

    before = state()
    x, y = synthetic_batch(LENET.spec, 16, seed=0, dtype=torch.float32)
    engine.train_batch(data_iter=iter(zip(x.split(4), y.split(4), strict=True)))
    return before, state()


@pytest.mark.skipif(not has["deepspeed"], reason="deepspeed is not installed")
def test_deepspeed_pipeline_step_equals_one_process() -> None:
    """From the weights DeepSpeed's stages started with, one process takes the same step."""
    before: dict[str, torch.Tensor] = {}
    after: dict[str, torch.Tensor] = {}
    for start, end in spawn(_deepspeed_rank, 2, timeout_s=240):
        before.update(start)
        after.update(end)
    model = build(LENET, torch.device("cpu"), "fp32")
    model.load_state_dict(before)
    want = _one_process_step(16, model)
    assert sorted(after) == sorted(want)
    for name, value in want.items():
        assert not torch.equal(value, before[name])  # the step moved every tensor
        # the updates (about 1e-6: lr x gradient), to within the weights' own rounding
        torch.testing.assert_close(after[name] - before[name], value - before[name],
                                   rtol=1e-3, atol=1e-9)  # fmt: skip
