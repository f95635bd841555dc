"""`pipecast train` with FSDP and tensor parallelism, as a user types it on CPU ranks."""

from __future__ import annotations

from typing import Any

import pytest

from pipecast.cli.main import main

GPT = ["--model", "gpt", "--dataset", "tokens", "--seq-len", "8", "--vocab", "64"]
SMALL = ["--width", "32", "--layers", "2", "--heads", "4", "--batch", "8", "--steps", "1"]


@pytest.mark.slow
def test_train_runs_a_sharded_and_split_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", *GPT, *SMALL, "--gpus", "4", "--replicas", "2", "--shard", "full"]
    argv += ["--tensor-parallel", "2", "--micro-batches", "1", "--device", "cpu"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "samples/s" in out
    assert "FSDP x2 x TP x2 on 4 cpu ranks" in out  # the header names the mesh


def test_sharding_without_replicas_is_refused_not_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--shard over one replica has nothing to shard over: run, it would quietly be a plain
    pipeline of 2 stages. One line, exit 2, before anything starts."""
    argv = ["train", *GPT, *SMALL, "--gpus", "2", "--shard", "full", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "pipecast: error: --shard full shards the weights over data-parallel replicas, and "
        "there is 1: add --replicas N (N of at least 2 dividing --gpus)"
    )


def test_a_model_without_a_plan_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["train", "--model", "transformer", "--dataset", "embeddings", "--seq-len", "8"]
    argv += ["--width", "32", "--layers", "2", "--heads", "4", "--batch", "8", "--steps", "1"]
    argv += ["--gpus", "2", "--tensor-parallel", "2", "--partition", "0,2", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "in_proj" in err


def test_a_degree_the_key_value_heads_do_not_divide_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A captured Llama with grouped-query attention (4 query heads, 2 key/value heads):
    4 ranks would each hold half a key/value head. One line, exit 2, before anything
    starts."""
    argv = ["train", "--model", "tests.user_models:small_llama", "--dataset", "tokens"]
    argv += ["--seq-len", "8", "--vocab", "64", "--batch", "8", "--steps", "1", "--gpus", "4"]
    argv += ["--tensor-parallel", "4", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "pipecast: error: block 1 has 2 key/value heads (grouped-query attention, 4 query "
        "heads), which 4 ranks cannot share: use a tensor-parallel degree that divides 2"
    )


@pytest.mark.slow
def test_train_runs_context_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", *GPT, *SMALL, "--gpus", "2", "--context-parallel", "2"]
    argv += ["--micro-batches", "1", "--device", "cpu"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "samples/s" in out
    assert "1f1b x context parallel x2 on 2 cpu ranks" in out


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (
            ["--model", "gpt", "--dataset", "tokens", "--seq-len", "6"],
            "the sequence length 6 does not divide by 4",
        ),
        (["--model", "lenet5", "--dataset", "mnist"], "this model has none"),
    ],
)
def test_context_parallel_refuses_what_it_cannot_split(
    model: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sequence that does not cut into 2 x degree chunks, a model with no causal attention
    over a sequence: one line, exit 2, before anything starts."""
    argv = ["train", *model, "--batch", "8", "--steps", "1", "--gpus", "2", "--device", "cpu"]
    argv += ["--context-parallel", "2", "--micro-batches", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err, err


def test_each_strategy_writes_its_own_trace() -> None:
    """Runs that differ only in replicas, sharding, tensor parallelism, offload or
    recomputation get trace names of their own, so one does not overwrite another; a plain
    pipeline keeps the plain name."""
    from types import SimpleNamespace

    from pipecast.cli.train_verb import _variant

    def job(replicas: int = 1, shard: str = "none", tp: int = 1, cp: int = 1, **config: str) -> Any:
        cfg = SimpleNamespace(offload="none", recompute="none")
        for k, v in config.items():
            setattr(cfg, k, v)
        plan = SimpleNamespace(name="1f1b", num_stages=1, num_ranks=1)
        return SimpleNamespace(replicas=replicas, shard=shard, tp=tp, cp=cp, config=cfg, plan=plan)

    names = [
        _variant(job()),
        _variant(job(replicas=2)),
        _variant(job(replicas=2, shard="full", tp=2)),
        _variant(job(offload="activations")),
        _variant(job(replicas=2, recompute="all")),
        _variant(job(replicas=2, cp=2)),
    ]
    assert names == [
        "",
        "-dp2",
        "-fsdp2-tp2",
        "-offload-activations",
        "-dp2-recompute-all",
        "-dp2-cp2",
    ]
