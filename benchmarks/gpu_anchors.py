"""The anchors comparison on 4 GPUs, lean: torch.distributed.pipelining's best candidates and
pipecast's schedules (planned and eager send posting) in one launch, on the same splits.

    OUT=/tmp/run python3 benchmarks/gpu_anchors.py --budget 300
    python3 benchmarks/gpu_anchors.py --dry-run
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from common import OUT, dump, left, log

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import run_suite
from pipecast.bench.suites import GPT, VGG16
from pipecast.models.workload import Workload


def configs(
    gpus: int,
    gpt: Workload,
    vgg: Workload,
    gb: int,
    vb: int,
    gsplit: tuple[int, ...],
    gsplit8: tuple[int, ...],
    vsplit: tuple[int, ...],
    vown: tuple[int, ...],
) -> list[BenchConfig]:
    g = BenchConfig(
        suite="anchors-final", system="torch", workload=gpt, gpus=gpus, batch=gb, boundaries=gsplit
    )
    gp = replace(g, system="pipecast", tags={"split": "same"})
    out = [
        replace(g, schedule="1f1b", microbatches=8),
        replace(g, schedule="1f1b", microbatches=16),
        replace(g, schedule="zb-v", microbatches=8, boundaries=gsplit8),
        replace(g, schedule="interleaved-zb", microbatches=8, boundaries=gsplit8),
    ]
    out += [
        replace(gp, schedule=s, microbatches=m)
        for s, m in (("1f1b", 8), ("1f1b", 16), ("zb-h1", 8), ("zb-h1", 16), ("gpipe", 8))
    ]
    out += [
        replace(gp, schedule=s, microbatches=8, boundaries=gsplit8) for s in ("interleaved", "zb-v")
    ]
    out += [
        replace(gp, schedule="zb-h1", microbatches=8, send_timing="eager"),
        replace(
            gp, schedule="interleaved", microbatches=8, boundaries=gsplit8, send_timing="eager"
        ),
    ]
    v = BenchConfig(
        suite="anchors-final",
        system="torch",
        workload=vgg,
        gpus=gpus,
        batch=vb,
        boundaries=vsplit,
        tags={"split": "same"},
    )
    vp = replace(v, system="pipecast")
    out += [
        replace(v, schedule="1f1b", microbatches=8),
        replace(v, schedule="1f1b", microbatches=4),
        replace(v, schedule="gpipe", microbatches=8),
    ]
    out += [
        replace(vp, schedule=s, microbatches=m)
        for s, m in (("zb-h1", 4), ("zb-h1", 8), ("1f1b", 8), ("1f1b", 4), ("gpipe", 8))
    ]
    out += [
        replace(vp, schedule=s, microbatches=m, boundaries=vown, tags={"split": "pipecast"})
        for s, m in (("zb-h1", 4), ("1f1b", 8))
    ]
    out += [
        replace(g, system="ddp", boundaries=()),
        replace(v, system="ddp", boundaries=(), tags={}),
    ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--rerun", help="also rerun this store's pipecast configurations")
    args = ap.parse_args()
    if args.dry_run:
        gpt = Workload(
            model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
        )
        vgg = Workload(model="vgg11", dataset="cifar10")
        cfgs = configs(2, gpt, vgg, 16, 16, (0, 4, 8), (0, 2, 4, 6, 8), (0, 15, 30), (0, 14, 30))
        cfgs = [replace(c, device="cpu", dtype="fp32", steps=2, warmup=1) for c in cfgs]
    else:
        cfgs = configs(
            4,
            GPT,
            VGG16,
            32,
            128,
            (0, 6, 12, 18, 24),
            tuple(range(0, 25, 3)),
            (0, 4, 10, 21, 40),
            (0, 5, 13, 24, 40),
        )
    if args.rerun:
        from pipecast.bench.store import Store

        again = [
            BenchConfig.from_dict(r.config)
            for r in Store(args.rerun).rows()
            if r.config["system"] == "pipecast" and r.suite != "anchors"
        ]
        cfgs += [replace(c, suite=f"{c.suite}-rerun") for c in again]
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    dump("environment.json", {"torch": torch.__version__, "names": names})
    log(f"{len(cfgs)} configurations on {names or ['cpu']}")
    run_suite(
        cfgs, str(OUT / "anchors.sqlite"), timeout_s=150, deadline=time.time() + left(args.budget)
    )
    log("done")


if __name__ == "__main__":
    main()
