"""Shared by the GPU benchmark scripts: output folder, logging, time budget, JSON."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

START = time.time()


def _terminated(signum: int, frame: object) -> None:
    """`timeout` ends a call with SIGTERM, which Python otherwise dies of at once: as an
    exit instead, a script's `finally` still packs what it wrote (and gpu_run records the
    machine's state at the end)."""
    raise SystemExit(128 + signum)


if multiprocessing.parent_process() is None:  # the script itself, not its spawned ranks
    signal.signal(signal.SIGTERM, _terminated)
OUT = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results" / "local")
OUT.mkdir(parents=True, exist_ok=True)


def log(message: str) -> None:
    line = f"[{time.time() - START:6.1f}s] {message}"
    print(line, flush=True)
    with open(OUT / "log.txt", "a") as fh:
        fh.write(line + "\n")


def dump(name: str, data: Any) -> None:
    (OUT / name).write_text(json.dumps(data, indent=1, default=str))


PACK = "all.tgz"


def pack() -> None:
    """Every other file of OUT in OUT/all.tgz (the originals stay): a device machine hands
    back only a few files of OUT, and that name sorts first (runs of this repository have
    lost profiles to that limit). With PACK_TO set (the device's own $OUT where OUT is a
    folder kept between calls), a copy goes there too: a call the device cuts off at its
    limit still hands back what was packed last (h100x4-run21's first call lost its six
    profiles so)."""
    import shutil
    import tarfile

    partial = OUT / f"{PACK}.partial"
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(OUT.iterdir()):
            if path.is_file() and path.name not in (PACK, partial.name):
                tar.add(path, arcname=path.name)
    os.replace(partial, OUT / PACK)
    if to := os.environ.get("PACK_TO"):
        copy = Path(to) / partial.name
        shutil.copyfile(OUT / PACK, copy)
        os.replace(copy, Path(to) / PACK)


def left(budget_s: float) -> float:
    return budget_s - (time.time() - START)


def stored_configs(store: Path, wanted: tuple[tuple[str, str, str, int], ...], suite: str) -> Any:
    """The 4-GPU pipecast configurations of a stored run whose (model, dataset, schedule,
    micro-batches) are in `wanted` (the first of each, cut backward), in `wanted`'s order,
    moved to `suite`: list[BenchConfig]."""
    from dataclasses import replace

    from pipecast.bench.config import BenchConfig
    from pipecast.bench.store import Store

    out: dict[tuple[str, str, str, int], BenchConfig] = {}
    for row in Store(str(store)).rows():
        c = BenchConfig.from_dict(row.config)
        key = (c.workload.model, c.workload.dataset, c.schedule, c.microbatches)
        if c.system == "pipecast" and c.gpus == 4 and key in wanted and c.cut_backward:
            out.setdefault(key, replace(c, suite=suite))
    return [out[k] for k in wanted if k in out]


def dry_pipelines(suite: str, schedules: tuple[str, ...]) -> Any:
    """A dry run's stand-ins: VGG-11/CIFAR-10 split in two over 2 CPU ranks, M=4, one
    configuration per schedule: list[BenchConfig]."""
    from pipecast.bench.config import BenchConfig
    from pipecast.models.workload import Workload

    workload = Workload(model="vgg11", dataset="cifar10")
    n = len(workload.build())
    return [
        BenchConfig(
            suite=suite,
            system="pipecast",
            workload=workload,
            gpus=2,
            batch=16,
            boundaries=(0, n // 2, n),
            schedule=schedule,
            microbatches=4,
            device="cpu",
            dtype="fp32",
            steps=2,
            warmup=1,
        )
        for schedule in schedules
    ]


def two_gpu_rows(suite: str, dry: bool) -> Any:
    """The host-bound 2-GPU configurations the host studies share (host_cpus.py,
    cuda_graphs.py), by name: 'vggc' (VGG-16/CIFAR-10 GPipe, M=1: set M), 'r18' and 'r50'
    (1F1B, M=4: ResNet-18 and ResNet-50 on ImageNet) and 'gpt' (24 layers of width 2048,
    batch 32, 1F1B, M=16), bf16, the median of 10 steps after 3; with `dry`, tiny stand-ins
    on CPU ranks: dict[str, BenchConfig]."""
    from dataclasses import replace

    from pipecast.bench.config import BenchConfig
    from pipecast.models.workload import Workload

    vggc = BenchConfig(
        suite=suite,
        system="pipecast",
        workload=Workload(
            model="lenet5" if dry else "vgg16", dataset="mnist" if dry else "cifar10"
        ),
        gpus=2,
        batch=32 if dry else 128,
        schedule="gpipe",
        boundaries=(0, 6, 12) if dry else (0, 20, 40),
        device="cpu" if dry else "cuda",
        dtype="fp32" if dry else "bf16",
        steps=2 if dry else 10,
        warmup=1 if dry else 3,
    )
    imagenet = "cifar10" if dry else "imagenet"
    pipe = replace(vggc, schedule="1f1b", microbatches=4)
    gpt = Workload(
        model="transformer",
        dataset="embeddings",
        seq_len=16 if dry else 1024,
        width=32 if dry else 2048,
        layers=6 if dry else 24,
        heads=4 if dry else 16,
    )
    return {
        "vggc": vggc,
        "r18": replace(
            pipe, workload=Workload(model="resnet18", dataset=imagenet), boundaries=(0, 3, 11)
        ),
        "r50": replace(
            pipe,
            workload=Workload(model="resnet18" if dry else "resnet50", dataset=imagenet),
            boundaries=(0, 4, 11) if dry else (0, 7, 19),
        ),
        "gpt": replace(
            pipe,
            workload=gpt,
            batch=32,
            microbatches=16,
            boundaries=(0, 3, 6) if dry else (0, 12, 24),
        ),
    }
