"""Benchmark suites as matrices of workloads x systems x GPUs x micro-batches.

* quick: LeNet-5 on CPU ranks in minutes: pipecast's schedules against one device, DDP and
  torch.distributed.pipelining, a micro-batch sweep, and a real-data (digits) accuracy run.
* seeds: the background studies' experiments (the GPipe study's splits x micro-batches);
  benchmarks/ builds the GPU matrices from these pieces.
* anchors: ANCHORS.md's GPT and VGG-16 workloads on 4 GPUs.
"""

from __future__ import annotations

from dataclasses import replace

from pipecast.bench.config import BenchConfig
from pipecast.errors import UnknownNameError
from pipecast.models.workload import Workload

LENET = Workload(model="lenet5", dataset="mnist")
DIGITS = Workload(model="lenet5", dataset="digits")
GPT = Workload(
    model="transformer", dataset="embeddings", seq_len=1024, width=2048, layers=24, heads=16
)
VGG16 = Workload(model="vgg16", dataset="imagenet")


def quick() -> list[BenchConfig]:
    base = BenchConfig(
        suite="quick",
        system="single",
        workload=LENET,
        gpus=1,
        batch=32,
        device="cpu",
        dtype="fp32",
        steps=3,
        warmup=1,
    )
    split = (0, 6, 12)
    pipe = replace(base, system="pipecast", gpus=2, microbatches=4, boundaries=split)
    out = [
        base,
        replace(base, system="ddp", gpus=2),
        replace(pipe, system="torch", schedule="1f1b"),
    ]
    out += [replace(pipe, schedule=s) for s in ("gpipe", "1f1b", "zb-h1")]
    out += [
        replace(pipe, schedule="gpipe", microbatches=m, tags={"study": "gpipe", "splits": "2"})
        for m in (1, 2, 8, 16)
    ]
    acc = replace(
        base, system="pipecast", workload=DIGITS, batch=64, accuracy_steps=80, boundaries=(0, 12)
    )
    out += [
        replace(acc, tags={"accuracy": "single device"}),
        replace(acc, gpus=2, replicas=2, tags={"accuracy": "data parallel"}),
        replace(acc, gpus=2, boundaries=split, microbatches=4, tags={"accuracy": "pipeline"}),
    ]
    return out


def gpipe_study(
    workload: Workload,
    splits: dict[int, tuple[int, ...]],
    batch: int,
    *,
    microbatches: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
) -> list[BenchConfig]:
    """End-to-end time for 1-4 splits x 1-32 micro-batches (the GPipe study's Figures 4.x)."""
    base = BenchConfig(
        suite="seeds", system="pipecast", workload=workload, gpus=1, batch=batch, schedule="gpipe"
    )
    return [
        replace(
            base,
            gpus=k,
            microbatches=m,
            boundaries=bounds,
            tags={"study": "gpipe", "splits": str(k)},
        )
        for k, bounds in splits.items()
        for m in microbatches
        if batch % m == 0
    ]


def anchors(
    gpt_split: tuple[int, ...] = (0, 6, 12, 18, 24),
    gpt_split8: tuple[int, ...] = tuple(range(0, 25, 3)),
    vgg_balanced: tuple[int, ...] = (0, 4, 10, 21, 40),
    vgg_pipecast: tuple[int, ...] | None = None,
    *,
    gpus: int = 4,
    gpt: Workload = GPT,
    vgg: Workload = VGG16,
    gpt_batch: int = 32,
    vgg_batch: int = 128,
) -> list[BenchConfig]:
    """ANCHORS.md: GPT (batch 32) and VGG-16 (batch 128) on 4 GPUs, pipecast and baselines.
    (Other sizes and workloads serve dry runs of the same matrix.)"""
    g = BenchConfig(suite="anchors", system="single", workload=gpt, gpus=1, batch=gpt_batch)
    gt = replace(g, system="torch", gpus=gpus, boundaries=gpt_split)
    gp = replace(g, system="pipecast", gpus=gpus, boundaries=gpt_split, tags={"split": "same"})
    out = [replace(g, microbatches=m) for m in (1, 16)] + [replace(g, system="ddp", gpus=gpus)]
    for m in (8, 16):
        out += [replace(gt, schedule=s, microbatches=m) for s in ("gpipe", "1f1b")]
        out += [replace(gp, schedule=s, microbatches=m) for s in ("gpipe", "1f1b", "zb-h1")]
    out += [
        replace(gt, schedule=s, microbatches=8, boundaries=gpt_split8)
        for s in ("interleaved", "interleaved-zb", "zb-v")
    ]
    out += [
        replace(gp, schedule=s, microbatches=8, boundaries=gpt_split8)
        for s in ("interleaved", "zb-v")
    ]
    v = BenchConfig(suite="anchors", system="single", workload=vgg, gpus=1, batch=vgg_batch)
    vt = replace(
        v,
        system="torch",
        gpus=gpus,
        schedule="1f1b",
        boundaries=vgg_balanced,
        tags={"split": "same"},
    )
    vp = replace(vt, system="pipecast")
    out += [v, replace(v, system="ddp", gpus=gpus)]
    blocks = vgg_balanced[-1]
    equal = tuple(round(blocks * i / gpus) for i in range(gpus + 1))
    for m in (4, 8):
        out += [
            replace(vt, microbatches=m, boundaries=equal, tags={"split": "equal"}),
            replace(vt, microbatches=m),
        ]
        for s in ("1f1b", "zb-h1"):
            out.append(replace(vp, schedule=s, microbatches=m))
            if vgg_pipecast:
                out.append(
                    replace(
                        vp,
                        schedule=s,
                        microbatches=m,
                        boundaries=vgg_pipecast,
                        tags={"split": "pipecast"},
                    )
                )
    out += [
        replace(vt, schedule="gpipe", microbatches=8),
        replace(vp, schedule="gpipe", microbatches=8),
    ]
    return out


SUITES = {"quick": quick, "anchors": anchors}


def suite(name: str) -> list[BenchConfig]:
    if name not in SUITES:
        raise UnknownNameError("suite", name, list(SUITES))
    return SUITES[name]()
