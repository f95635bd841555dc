"""The steady misses of h100x4-run5 and -run6, timeline by timeline: VGG-16/ImageNet ZB-H1 and
1F1B over 4 GPUs (device-bound, predicted 7-10% fast on both runs) and ResNet-18 1F1B over 4
GPUs (predicted 23-34% fast), each row's simulated and measured action timelines side by
side in a report (report/miss_*.png).

    cd benchmarks && OUT=/tmp/r python3 miss_timelines.py       (--dry-run: tiny, on CPU ranks)
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import gpu_run
from common import OUT, log

from pipecast.bench.config import BenchConfig
from pipecast.bench.predictions import predictions
from pipecast.bench.runner import run_suite
from pipecast.hardware.probe import probe
from pipecast.models.workload import Workload
from pipecast.report.html import build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    dry = ap.parse_args().dry_run
    device, dtype = ("cpu", "fp32") if dry else ("cuda", "bf16")
    gpus = 2 if dry else 4
    cluster = probe(gpu_run.probe_options(gpus, dry)).cluster
    cluster.save(str(OUT / "cluster.json"))
    vgg = Workload(model="vgg11" if dry else "vgg16", dataset="cifar10" if dry else "imagenet")
    r18 = Workload(model="resnet18", dataset="cifar10" if dry else "imagenet")
    batch = 16 if dry else 128
    pv = gpu_run.profile("vgg16", vgg, (2, 4) if dry else (16, 32), device=device, dtype=dtype)
    pr = gpu_run.profile("resnet18", r18, (4, 8) if dry else (32, 64), device=device, dtype=dtype)
    # the anchors' VGG split over 4 GPUs (two stages for a dry run)
    vsplit = (0, pv.num_blocks // 2, pv.num_blocks) if dry else (0, 4, 10, 21, 40)
    base = BenchConfig(
        suite="misses",
        system="pipecast",
        workload=vgg,
        gpus=gpus,
        batch=batch,
        boundaries=vsplit,
        steps=10,
        warmup=3,
        tags={"split": "same"},
    )
    configs = [
        replace(base, schedule="zb-h1", microbatches=4),
        replace(base, schedule="1f1b", microbatches=8),
        replace(
            base,
            workload=r18,
            schedule="1f1b",
            microbatches=4,
            tags={"split": "pipecast"},
            boundaries=gpu_run.balanced(pr, cluster, gpus, batch // 4, 4),
        ),
    ]
    if dry:
        configs = [replace(c, device="cpu", dtype="fp32", steps=2, warmup=1) for c in configs]
    predicted = predictions(configs, {vgg.key: pv, r18.key: pr}, cluster)
    run_suite(configs, str(OUT / "bench.sqlite"), predicted=predicted, timeout_s=120)
    build(str(OUT / "bench.sqlite"), str(OUT / "report"), cluster=cluster)
    log("done")


if __name__ == "__main__":
    main()
