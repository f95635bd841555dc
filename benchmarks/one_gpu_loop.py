"""VGG-16/CIFAR-10 on one GPU: is the runtime's one-stage loop off, or the profile's reading?
h100x4-run17 and h200x4-run14 measured this model's one-GPU GPipe rows 15-34% slower than
predicted, with no other rank, no transfer and no pipeline. In one process, in interleaved
rounds: the profiler's whole-model step (`measure_step`: forward, loss and backward, no
optimizer) at 128 and 8 samples, and the runtime's one-stage GPipe at M=1 and M=16 (the
suite's own configurations, read from h200x4-run14's store, and the same without the
per-action CUDA events the bench records), each beside its prediction
from a profile taken in the same process just before (and from h200x4-run14's profile).

    OUT=/tmp/o python3 benchmarks/one_gpu_loop.py [--rounds 3]
    python3 benchmarks/one_gpu_loop.py --dry-run       # LeNet-5 on a CPU rank, tiny
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from typing import Any

import torch
from common import OUT, dump, log, pack

from pipecast.bench.config import BenchConfig
from pipecast.bench.predictions import predictions
from pipecast.bench.runner import pipecast_job, run_config
from pipecast.bench.store import Store
from pipecast.bench.suites import LENET
from pipecast.hardware import hostspeed
from pipecast.hardware.cluster import Cluster
from pipecast.profile.profiler import ProfileOptions, measure_step, profile_model
from pipecast.profile.types import Profile
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.worker import run_rank

STORED = "results/h200x4-run14"
LABELS = ("vgg16/cifar10 b128 pipecast gpipe 1st M=1", "vgg16/cifar10 b128 pipecast gpipe 1st M=16")


def _configs(dry: bool) -> list[BenchConfig]:
    if dry:
        base = BenchConfig(
            suite="accuracy",
            system="pipecast",
            workload=LENET,
            gpus=1,
            batch=16,
            schedule="gpipe",
            boundaries=(0, len(LENET.build())),
            device="cpu",
            dtype="fp32",
            steps=3,
            warmup=1,
        )
        return [base, replace(base, microbatches=4)]
    stored = [BenchConfig.from_dict(r.config) for r in Store(f"{STORED}/bench.sqlite").rows()]
    by_label = {c.label(): c for c in stored}
    return [by_label[label] for label in LABELS]


def _rank(ctx: Context, configs: list[BenchConfig], rounds: int) -> dict[str, Any]:
    cfg = configs[0]
    device = "cuda" if ctx.device.type == "cuda" else "cpu"
    sizes = (8, 128) if device == "cuda" else (4, 16)
    options = ProfileOptions(micro_batches=sizes, device=device, dtype=cfg.dtype)  # type: ignore[arg-type]
    prof = profile_model(
        cfg.workload.build(), cfg.workload.spec, options, model_name=cfg.workload.model
    )
    model = cfg.workload.build()
    out: list[dict[str, float]] = []
    for r in range(rounds):
        row: dict[str, float] = {"issue_ms": hostspeed.issue(ctx.device) * 1e3}
        for mb in sizes:
            step = measure_step(
                model,
                cfg.workload.spec,
                mb,
                ProfileOptions(device=device, dtype=cfg.dtype, warmup=3, repeats=10),  # type: ignore[arg-type]
            )
            row[f"measure_step {mb}"] = step * 1e3
        for c in configs:
            row[c.label()] = run_config(ctx, c)["step_time"] * 1e3
            # the same loop without the per-action CUDA events the bench records
            job = pipecast_job(c)
            job = replace(job, config=replace(job.config, record_events=False))
            times = sorted(s.seconds for s in run_rank(ctx, job).steps)
            row[f"{c.label()} no events"] = times[len(times) // 2] * 1e3
        out.append(row)
        log(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row.items()))
    return {"profile": prof.to_json(), "rounds": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    dry = args.dry_run or not torch.cuda.is_available()
    configs = _configs(dry)
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if not dry else 'cpu'}")
    try:
        (result,) = spawn(_rank, 1, (configs, args.rounds), backend="gloo" if dry else "nccl")
        fresh = Profile.from_json(result["profile"])
        fresh.save(str(OUT / "profile_vgg16_cifar.json"))
        cluster = Cluster.load(f"{STORED}/cluster.json")
        key = configs[0].workload.key
        predicted = {"fresh": predictions(configs, {key: fresh}, cluster)}
        if not dry:
            stored = Profile.load(f"{STORED}/profile_vgg16_cifar.json")
            predicted["stored"] = predictions(configs, {key: stored}, cluster)
        summary: dict[str, Any] = {"rounds": result["rounds"], "predicted_ms": {}}
        for name, preds in predicted.items():
            summary["predicted_ms"][name] = {
                c.label(): preds[c.key]["step_time"] * 1e3 for c in configs if c.key in preds
            }
        for size in fresh.micro_batches:  # the profile's own whole-model sums
            st = asdict(fresh.stage(0, fresh.num_blocks, size))
            summary[f"profile_sum_{size}_ms"] = {
                k: v * 1e3 for k, v in st.items() if isinstance(v, float)
            }
        dump("one_gpu_loop.json", summary)
        log(json.dumps(summary["predicted_ms"]))
    finally:
        pack()


if __name__ == "__main__":
    main()
