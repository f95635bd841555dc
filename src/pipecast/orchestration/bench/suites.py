"""Benchmark suites as matrices of workloads x systems x GPUs x micro-batches.

* quick: LeNet-5 on CPU ranks in minutes: pipecast's schedules against one device, DDP and
  torch.distributed.pipelining, a micro-batch sweep, and a real-data (digits) accuracy run.
* seeds: the background studies' experiments (the GPipe study's splits x micro-batches);
  the accuracy suite takes these pieces.
* anchors: the anchor workloads, GPT and VGG-16, on 4 GPUs, against every baseline.
* runtime: pipecast's graphed runtime against torch.distributed.pipelining on N GPUs.
* accuracy (pipecast.orchestration.bench.accuracy_suite): the recommender's predictions against
  measurement; it needs profiles and a probe first (benchmarks/run.py takes them).
"""

from __future__ import annotations

from dataclasses import replace

from pipecast.errors import UnknownNameError
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.values.models.workload import Workload

LENET = Workload(model="lenet5", dataset="mnist")
DIGITS = Workload(model="lenet5", dataset="digits")
GPT = Workload(
    model="transformer", dataset="embeddings", seq_len=1024, width=2048, layers=24, heads=16
)
VGG16 = Workload(model="vgg16", dataset="imagenet")


QUICK_WARMUP, QUICK_STEPS = 5, 40
"""The quick suite's warm-up and timed steps per row: LeNet-5's short steps on CPU ranks
move by tens of per cent from one step to the next (docs/decisions.md, "Rows that waited
for a core"), and the first few pay for buffers and thread pools the rest reuse."""


def quick() -> list[BenchConfig]:
    base = BenchConfig(
        suite="quick",
        system="single",
        workload=LENET,
        gpus=1,
        batch=32,
        device="cpu",
        dtype="fp32",
        steps=QUICK_STEPS,
        warmup=QUICK_WARMUP,
    )
    split = (0, 6, 12)
    pipe = replace(base, system="pipecast", gpus=2, microbatches=4, boundaries=split)
    out = [
        base,
        replace(pipe, gpus=1, boundaries=(0, 12), microbatches=1, schedule="1f1b"),
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
    """The anchor workloads, GPT (batch 32) and VGG-16 (batch 128), on 4 GPUs: pipecast and
    its baselines (docs/benchmarks.md).
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


def runtime(gpus: int = 2, *, gpt: Workload = GPT, vgg: Workload = VGG16) -> list[BenchConfig]:
    """pipecast's runtime against torch.distributed.pipelining, DDP and one GPU on the GPT
    stack (batch 32) and VGG-16 (batch 128), in one launch: torch's schedules on an even
    split (GPT) and on the split balanced by measured time (VGG-16, 0,10,40 for 2 GPUs);
    pipecast's every schedule, graphed, at 8, 16 and 32 micro-batches (GPT) and on torch's
    own split and schedule (VGG-16)."""
    layers = len(gpt.build("meta"))

    def even(stages: int) -> tuple[int, ...]:
        return tuple(round(layers * i / stages) for i in range(stages + 1))

    g = BenchConfig(
        suite="runtime", system="torch", workload=gpt, gpus=gpus, batch=32, schedule="1f1b",
        microbatches=8, boundaries=even(gpus), steps=3, warmup=2,
    )  # fmt: skip
    two = even(2 * gpus)
    out = [
        replace(g, system="single", microbatches=1),
        replace(g, system="ddp", microbatches=1),
        g,
        replace(g, schedule="gpipe"),
        replace(g, schedule="interleaved", boundaries=two),
        replace(g, schedule="zb-v", boundaries=two),
    ]
    gp = replace(g, system="pipecast", cuda_graphs=True, send_timing="eager")
    for schedule in ("zb-h1", "1f1b", "gpipe", "interleaved", "zb-v"):
        bounds = two if schedule in ("interleaved", "zb-v") else g.boundaries
        out += [
            replace(gp, schedule=schedule, microbatches=m, boundaries=bounds) for m in (8, 16, 32)
        ]
    split = (0, 10, 40) if gpus == 2 else (0, 4, 10, 21, 40)
    v = BenchConfig(
        suite="runtime", system="torch", workload=vgg, gpus=gpus, batch=128, schedule="1f1b",
        microbatches=4, boundaries=split, steps=4, warmup=2,
    )  # fmt: skip
    vp = replace(v, system="pipecast", cuda_graphs=True, send_timing="eager")
    out += [
        replace(v, system="single", microbatches=1),
        replace(v, system="ddp", microbatches=1),
        v,
        replace(v, microbatches=8),
        replace(v, schedule="gpipe"),
        vp,
        replace(vp, cuda_graphs=False),
        replace(vp, schedule="zb-h1"),
        replace(vp, schedule="zb-h1", microbatches=8),
    ]
    return out


SUITES = {"quick": quick, "anchors": anchors, "runtime": runtime}


def suite(name: str) -> list[BenchConfig]:
    if name not in SUITES:
        raise UnknownNameError("suite", name, list(SUITES))
    return SUITES[name]()
