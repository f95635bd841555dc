"""The background studies' own pipeline systems as baselines: torchgpipe (the GPipe of
seeds/003 and seeds/004) and DeepSpeed's pipeline engine (1F1B, the schedule seeds/002 calls
DAPPLE's).

Each trains the workload's blocks with plain SGD on weights already in the run's dtype, as the
other baselines do, so a row differs from pipecast's only in the system. Neither package is
required: a missing one raises a ConfigError naming the extra, which the suite runner records
as the row's error and goes on.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pipecast.errors import ConfigError
from pipecast.extras import require
from pipecast.orchestration.bench.baselines import build
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.suites import GPT, VGG16
from pipecast.orchestration.bench.timing import barrier, gather_peaks, timed_steps
from pipecast.runtime import devices
from pipecast.runtime.launch import Context
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models.workload import Workload

STUDIES_EXTRA = "pip install 'pipecast[studies]'"

CHECKPOINT = {"none": "never", "all-but-last": "except_last", "all": "always"}
"""pipecast's recompute setting -> torchgpipe's checkpoint mode (its default: except_last)."""


def _require(package: str) -> Any:
    return require(package, needed_by=f"the {package} baseline", install=STUDIES_EXTRA)


def counts(boundaries: list[int]) -> list[int]:
    """A split [0, b1, ..., blocks] as torchgpipe's balance: blocks per partition."""
    return [b - a for a, b in itertools.pairwise(boundaries)]


def torchgpipe_model(
    model: nn.Sequential,
    sample: torch.Tensor,
    stages: list[torch.device],
    *,
    microbatches: int,
    boundaries: list[int] | None,
    balance: str,
    recompute: str,
) -> tuple[nn.Module, list[int]]:
    """`model` wrapped in torchgpipe's GPipe over `stages`, and the balance it got: the
    given split, or torchgpipe's own balance by time or by memory ('time', 'size')
    profiled on a micro-batch of `sample`."""
    tg = _require("torchgpipe")
    if boundaries:
        got = counts(boundaries)
    elif balance in ("time", "size"):
        tb = importlib.import_module("torchgpipe.balance")
        micro = sample[: max(1, sample.shape[0] // microbatches)]
        if balance == "time":
            got = list(tb.balance_by_time(len(stages), model, micro, device=stages[0]))
        else:
            got = list(tb.balance_by_size(len(stages), model, micro, chunks=microbatches,
                                          device=stages[0]))  # fmt: skip
        model.zero_grad(set_to_none=True)  # its profiler leaves no gradient behind, but be sure
    else:
        raise ConfigError(f"torchgpipe needs a split or balance 'time' or 'size', not {balance!r}")
    if recompute not in CHECKPOINT:
        raise ConfigError(f"recompute {recompute!r}: torchgpipe knows {sorted(CHECKPOINT)}")
    wrapped = tg.GPipe(
        model, balance=got, devices=stages, chunks=microbatches, checkpoint=CHECKPOINT[recompute]
    )
    return wrapped, got


def torchgpipe_run(
    ctx: Context,
    workload: Workload,
    batch: int,
    boundaries: list[int],
    *,
    stages: int,
    microbatches: int,
    balance: str = "",
    recompute: str = "none",
    dtype: str = "bf16",
    steps: int = 6,
    warmup: int = 2,
) -> dict[str, Any]:
    """torchgpipe in rank 0's process over the first `stages` devices (it is
    single-process: one thread per device); the other ranks wait at the step barriers."""
    result: dict[str, Any] = {"step_time": 0.0, "peak_allocated": 0, "peak_reserved": 0}
    used: list[int] = []
    peaks: list[tuple[int, int]] = []
    if ctx.rank == 0:
        if ctx.device.type == "cuda":
            if torch.cuda.device_count() < stages:
                raise ConfigError(f"torchgpipe over {stages} GPUs: {torch.cuda.device_count()}")
            places = [torch.device("cuda", i) for i in range(stages)]
        else:
            places = [torch.device("cpu")] * stages
        torch.manual_seed(0)
        # its profiler and its partitions take inputs that require grad: no in-place op there
        model = build(workload, places[0], dtype, inplace=False)
        x, y = synthetic_batch(workload.spec, batch, seed=0, dtype=devices.DTYPES[dtype])
        x, y = x.to(places[0]), y.to(places[-1])
        wrapped, used = torchgpipe_model(
            model, x, places, microbatches=microbatches, boundaries=boundaries or None,
            balance=balance, recompute=recompute,
        )  # fmt: skip
        opt = torch.optim.SGD(wrapped.parameters(), lr=1e-4)
        loss_fn = loss_for(workload.spec)
        for place in places:
            devices.reset_peak(place)

        def step() -> None:
            torch.autograd.backward(loss_fn(wrapped(x), y))
            opt.step()
            opt.zero_grad(set_to_none=True)
            for place in places[1:]:
                devices.synchronize(place)

        result = timed_steps(step, ctx.device, steps=steps, warmup=warmup)
        peaks = [(devices.peak_allocated(p), devices.peak_reserved(p)) for p in places]
    else:
        for _ in range(steps + warmup):  # keep step with rank 0's barriers
            barrier(ctx.device)
            barrier(ctx.device)
    result = gather_peaks(result, ctx.device)
    if ctx.rank == 0 and ctx.device.type == "cuda":  # every GPU it used, not only rank 0's
        result["peak_allocated"] = [a for a, _ in peaks]
        result["peak_reserved"] = [r for _, r in peaks]
    result["boundaries"] = [sum(used[:i]) for i in range(len(used) + 1)]
    return result


class _Blocks(nn.Sequential):
    """One pipeline stage's blocks, built on the rank that holds it (DeepSpeed's LayerSpec
    builds each stage only where it runs)."""

    def __init__(self, workload: dict[str, Any], first: int, end: int, dtype: str) -> None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")  # fmt: skip
        part = build(Workload.from_dict(workload), device, dtype, blocks=slice(first, end))
        super().__init__(*part)


def deepspeed_engine(
    ctx: Context,
    workload: Workload,
    batch: int,
    boundaries: list[int],
    *,
    microbatches: int,
    dtype: str,
) -> Any:
    """DeepSpeed's PipelineEngine over this world, one stage per rank on `boundaries`,
    gradient accumulation over `microbatches` (its 1F1B TrainSchedule)."""
    ds = _require("deepspeed")
    pipe = importlib.import_module("deepspeed.pipe")
    if len(boundaries) - 1 != ctx.world:
        raise ConfigError(f"DeepSpeed here runs one stage per rank: {ctx.world} ranks, "
                          f"split {boundaries}")  # fmt: skip
    if batch % microbatches:
        raise ConfigError(f"batch {batch} does not split into {microbatches} micro-batches")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    os.environ.setdefault("LOCAL_RANK", str(ctx.local_rank))
    ds.init_distributed(dist_backend="nccl" if ctx.device.type == "cuda" else "gloo")
    torch.manual_seed(0)
    specs = [
        pipe.LayerSpec(_Blocks, workload.to_dict(), a, b, dtype)
        for a, b in itertools.pairwise(boundaries)
    ]
    module = pipe.PipelineModule(
        layers=specs, num_stages=ctx.world, partition_method="uniform",
        loss_fn=loss_for(workload.spec),
    )  # fmt: skip
    opt = torch.optim.SGD(module.parameters(), lr=1e-4)
    config = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": batch // microbatches,
        "gradient_accumulation_steps": microbatches,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, *_ = ds.initialize(model=module, optimizer=opt, config=config)
    return engine


def deepspeed_run(
    ctx: Context,
    workload: Workload,
    batch: int,
    boundaries: list[int],
    *,
    microbatches: int,
    dtype: str = "bf16",
    steps: int = 6,
    warmup: int = 2,
) -> dict[str, Any]:
    """DeepSpeed's pipeline engine, timed like every other system."""
    engine = deepspeed_engine(
        ctx, workload, batch, boundaries, microbatches=microbatches, dtype=dtype
    )
    x, y = synthetic_batch(workload.spec, batch, seed=0, dtype=devices.DTYPES[dtype])
    pairs = list(zip(torch.tensor_split(x.to(ctx.device), microbatches),
                     torch.tensor_split(y.to(ctx.device), microbatches), strict=True))  # fmt: skip

    def feed() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(pairs)

    result = timed_steps(
        lambda: engine.train_batch(data_iter=feed()), ctx.device, steps=steps, warmup=warmup
    )
    return gather_peaks(result, ctx.device)


def run_torchgpipe(ctx: Context, cfg: BenchConfig) -> dict[str, Any]:
    """A `torchgpipe` configuration, for the suite runner (pipecast.orchestration.bench.runner)."""
    return torchgpipe_run(
        ctx, cfg.workload, cfg.batch, list(cfg.boundaries), stages=cfg.stages,
        microbatches=cfg.microbatches, balance=cfg.balance, recompute=cfg.recompute,
        dtype=cfg.dtype, steps=cfg.steps, warmup=cfg.warmup,
    )  # fmt: skip


def run_deepspeed(ctx: Context, cfg: BenchConfig) -> dict[str, Any]:
    """A `deepspeed` configuration, for the suite runner."""
    return deepspeed_run(
        ctx, cfg.workload, cfg.batch, list(cfg.boundaries), microbatches=cfg.microbatches,
        dtype=cfg.dtype, steps=cfg.steps, warmup=cfg.warmup,
    )  # fmt: skip


SYSTEMS = {"torchgpipe": run_torchgpipe, "deepspeed": run_deepspeed}
"""The studies' systems by the name a configuration gives (BenchConfig.system)."""


def studies(gpus: int = 2, *, gpt: Workload = GPT, vgg: Workload = VGG16) -> list[BenchConfig]:
    """The background studies' own systems beside torch.distributed.pipelining and pipecast,
    in one launch, on the runtime suite's workloads and splits: torchgpipe on the same split
    (without and with its default recomputation) and on its own balance by time and by
    memory; DeepSpeed's pipeline engine (1F1B) on the same split; torch's 1F1B and
    pipecast's GPipe, 1F1B and ZB-H1 (graphed) rerun beside them."""

    def even(w: Workload) -> tuple[int, ...]:
        blocks = len(w.build("meta"))
        return tuple(round(blocks * i / gpus) for i in range(gpus + 1))

    vsplit = even(vgg)
    if vgg == VGG16 and gpus in (2, 4):  # the runtime suite's splits, balanced by time
        vsplit = (0, 10, 40) if gpus == 2 else (0, 4, 10, 21, 40)
    out: list[BenchConfig] = []
    for w, batch, m, bounds in ((gpt, 32, 8, even(gpt)), (vgg, 128, 4, vsplit)):
        t = BenchConfig(
            suite="studies", system="torch", workload=w, gpus=gpus, batch=batch,
            schedule="1f1b", microbatches=m, boundaries=bounds, steps=4, warmup=2,
        )  # fmt: skip
        tg = replace(t, system="torchgpipe", schedule="gpipe")
        pc = replace(t, system="pipecast", cuda_graphs=True, send_timing="eager")
        out += [
            replace(t, system="single", microbatches=1),
            t,
            replace(pc, schedule="gpipe"),
            pc,
            replace(pc, schedule="zb-h1"),
            tg,
            replace(tg, recompute="all-but-last"),
            replace(tg, boundaries=(), balance="time"),
            replace(tg, boundaries=(), balance="size"),
            replace(t, system="deepspeed"),
        ]
    # seeds/000's Table 4.1: one split (one GPU) of VGG16 at batch 128 over 2-32 micro-batches
    one = replace(out[-10], tags={"study": "gpipe-4.1"})
    out += [replace(one, microbatches=m) for m in (2, 4, 8, 16, 32)]
    return out
