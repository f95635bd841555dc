"""FSDP, tensor parallelism and their meshes, run by torch's own engines inside pipecast's
runtime on CPU ranks (gloo): each trains to the weights one process reaches on the same
batches. A small GPT (the zoo's: separate q, k and v projections), plain SGD; and a
captured Hugging Face Llama with grouped-query attention split over 2 ranks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, reference_step, run_all

from pipecast.api import make_job
from pipecast.errors import ConfigError
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.values.models import Workload

GPT = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=64, width=32, layers=2, heads=4)
BATCH, STEPS = 8, 2
BLOCKS = 4  # embedding, two transformer blocks, head
LLAMA = Workload(model="tests.user_models:small_llama", dataset="tokens", seq_len=8, vocab=64)
LLAMA_BLOCKS = 7  # embedding, each layer's attention and MLP halves, norm, head
_GPT_SPLIT = ("q", "k", "v", "proj", "up", "down")
_LLAMA_SPLIT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROJECTIONS = tuple(f"{p}.weight" for p in (*_GPT_SPLIT, *_LLAMA_SPLIT))
"""The weights tensor parallelism splits, in the zoo's GPT and in Llama."""


def _job(
    schedule: str,
    stages: int,
    microbatches: int,
    *,
    replicas: int = 1,
    workload: Workload = GPT,
    compile: str = "off",
    **mesh: object,
) -> TrainJob:
    blocks = LLAMA_BLOCKS if workload is LLAMA else BLOCKS
    bounds = [0, blocks] if stages == 1 else [0, 2, blocks]
    job = pipeline_job(
        workload,
        schedule,
        stages,
        microbatches,
        bounds,
        batch=BATCH,
        replicas=replicas,
        steps=STEPS,
        config=RunConfig(lr=0.1, timeout_s=120, compile=compile),  # type: ignore[arg-type]
    )
    return replace(job, **mesh)  # type: ignore[arg-type]


CASES = {
    "FSDP x2": _job("1f1b", 1, 1, replicas=2, shard="full"),
    "FSDP x2, no reshard, accumulate 2": _job("1f1b", 1, 2, replicas=2, shard="grad"),
    "TP x2": _job("1f1b", 1, 1, tp=2),
    "FSDP x2 x TP x2": _job("1f1b", 1, 1, replicas=2, shard="full", tp=2),
    "data parallel x2 x TP x2": _job("1f1b", 1, 2, replicas=2, tp=2),
    "FSDP x2 x 1f1b 2 stages": _job("1f1b", 2, 2, replicas=2, shard="grad"),
    "FSDP x2 x zb-h1 2 stages": _job("zb-h1", 2, 4, replicas=2, shard="grad"),
    "1f1b 2 stages x TP x2": _job("1f1b", 2, 2, tp=2),
    "zb-h1 2 stages x TP x2": _job("zb-h1", 2, 2, tp=2),
    "hf Llama TP x2": _job("1f1b", 1, 1, tp=2, workload=LLAMA),
    # torch.compile over the blocks FSDP and tensor parallelism split, as torchtitan runs them
    "FSDP x2, compiled": _job("1f1b", 1, 2, replicas=2, shard="full", compile="blocks"),
    "zb-h1 2 stages x TP x2, compiled": _job("zb-h1", 2, 2, tp=2, compile="blocks"),
}


@pytest.fixture(scope="module")
def results() -> dict[str, object]:
    names = list(CASES)
    return dict(zip(names, run_all([CASES[n] for n in names]), strict=True))


def _reference(workload: Workload) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    params, _ = reference_step(workload.build(), workload, BATCH, lr=0.1, steps=STEPS)
    return params


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_mesh_trains_to_one_process_weights(case: str, results: dict[str, object]) -> None:
    job = CASES[case]
    assert job.workload is not None
    reference = _reference(job.workload)
    assert_close(merged(results[case], "params"), reference)  # type: ignore[arg-type]
    # each rank holds its share, not the whole: a run that skipped the split or the shard
    # would train to the same weights
    for report in results[case].reports:  # type: ignore[attr-defined]
        whole = {name: report.params[name].numel() for name in report.held}
        assert sum(report.held.values()) < sum(whole.values()), case
        if job.tp == 2 and job.shard == "none":  # every planned projection split in two
            split = [n for n in report.held if n.endswith(PROJECTIONS)]
            assert split and all(2 * report.held[n] == whole[n] for n in split), case


def test_a_mesh_refuses_what_it_cannot_run() -> None:
    """One line each, before anything starts: tensor parallelism on a model with no plan,
    a degree the heads do not divide by, FSDP with PipeDream or clipping."""
    stack = Workload(model="transformer", dataset="embeddings", seq_len=8, width=32, layers=2)
    job = replace(pipeline_job(stack, "1f1b", 1, 1, [0, 2], batch=8), tp=2)
    with pytest.raises(ConfigError, match="in_proj"):
        job.check()
    with pytest.raises(ConfigError, match="4 attention heads"):
        replace(CASES["TP x2"], tp=3).check()
    pipedream = replace(_job("pipedream", 2, 2, replicas=2), shard="grad")
    with pytest.raises(ConfigError, match="PipeDream"):
        pipedream.check()
    clipped = replace(CASES["FSDP x2"], config=RunConfig(clip_grad_norm=1.0))
    with pytest.raises(ConfigError, match="clipping"):
        clipped.check()
    resharded = replace(CASES["FSDP x2 x 1f1b 2 stages"], shard="full")
    with pytest.raises(ConfigError, match="--shard grad"):
        resharded.check()


def test_a_captured_models_check_exports_it_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making a job and checking it read a captured model's shapes for its partition, its
    block count and its tensor-parallel split: one export (seconds) for all, and none the
    second time, in the launcher as in each rank."""
    from pipecast.values.models import workload as workloads

    exports: list[str] = []
    build = workloads.build_source_model

    def counted(path: str, *args: object, **kwargs: object) -> torch.nn.Sequential:
        exports.append(path)
        return build(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(workloads, "build_source_model", counted)
    other = replace(LLAMA, seq_len=4)  # no earlier test's check has read this one
    job, _ = make_job(
        other, gpus=2, tensor_parallel=2, partition=f"0,{LLAMA_BLOCKS}", microbatches=1
    )
    job.check()
    assert exports == [other.model]
