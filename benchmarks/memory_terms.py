"""What a rank's GPU memory holds at its peak, against what the planner predicts.

    python -m benchmarks.memory_terms run --out DIR          # on a GPU: measure
    python -m benchmarks.memory_terms analyze DIR/NAME.pickle  # anywhere: read a snapshot

`run` profiles each workload briefly, predicts one device's peak (graphed and eager) and runs
the same step with torch's allocator recording every allocation from the second step on; at
the fourth step's barrier it writes the allocator's snapshot (torch.cuda.memory._snapshot)
and the rank's peaks (allocated and reserved). `analyze` replays a snapshot's trace to the
moment the most was allocated and sums what was alive then by where it was allocated (the
innermost pipecast or torch frame), beside the reserved segments by pool: the terms the
memory model must hold.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pickle
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from pipecast.values.training import Offload

WORKLOADS = {
    "gpt": {"model": "gpt", "dataset": "tokens", "seq_len": 1024, "width": 1024, "layers": 8},
    "transformer": {
        "model": "transformer",
        "dataset": "embeddings",
        "seq_len": 1024,
        "width": 2048,
        "layers": 8,
        "heads": 16,
    },
    "resnet50": {"model": "resnet50", "dataset": "imagenet"},
    "vgg16_cifar": {"model": "vgg16", "dataset": "cifar10"},
    "tv_resnet18": {"model": "torchvision:resnet18", "dataset": "cifar10"},
    "hf_llama": {
        "model": "hf:llama",
        "dataset": "tokens",
        "seq_len": 1024,
        "width": 1024,
        "layers": 8,
        "heads": 16,
        "vocab": 32000,
    },
}
BATCH = {
    "gpt": 8,
    "transformer": 8,
    "resnet50": 64,
    "vgg16_cifar": 128,
    "tv_resnet18": 128,
    "hf_llama": 8,
}
RECORD_FROM, DUMP_AT = 0, 3
"""Record allocations from the first step (the eager step and the graphs' capture) and dump
at the fourth's start, after two replayed steps."""
_BASELINE: dict[str, int] = {}


def record_hook(rank: int, step: int, *, path: str) -> None:
    """TrainJob.before_step: start recording, then write the snapshot and the peaks."""
    import torch

    if step == RECORD_FROM:
        _BASELINE["allocated"] = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=150_000
        )
    if step == DUMP_AT:
        snapshot = torch.cuda.memory._snapshot()
        snapshot["pipecast_peaks"] = {
            "allocated": torch.cuda.max_memory_allocated(),
            "reserved": torch.cuda.max_memory_reserved(),
            "baseline": _BASELINE.get("allocated", 0),
        }
        with gzip.open(path, "wb") as fh:
            pickle.dump(snapshot, fh)
        torch.cuda.memory._record_memory_history(enabled=None)


VARIANTS: dict[str, tuple[bool, int, Offload]] = {
    "graphed": (True, 1, "none"),
    "eager": (False, 1, "none"),
    "graphed_m4": (True, 4, "none"),
    "host_optimizer": (True, 1, "optimizer"),
    "host_both_m4": (False, 4, "both"),
}
"""Name -> (CUDA graphs, micro-batches accumulated, what waits on the host)."""


def run(out: Path, names: list[str], variants: list[str]) -> list[dict[str, Any]]:
    from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
    from pipecast.planning.recommend.predict import predict
    from pipecast.planning.schedules import make_plan
    from pipecast.runtime.config import RunConfig
    from pipecast.runtime.job import TrainJob
    from pipecast.runtime.run import run_job
    from pipecast.values.hardware.presets import preset
    from pipecast.values.models.workload import Workload
    from pipecast.values.partition import from_boundaries
    from pipecast.values.strategy import Strategy

    cluster = preset("h200-nvlink").subset(1)
    rows = []
    for name in names:
        w = Workload.from_dict(WORKLOADS[name])
        batch = BATCH[name]
        began = time.time()
        options = ProfileOptions(
            micro_batch_sizes=(batch,), device="cuda", dtype="bf16", warmup=1, repeats=3
        )
        profile = profile_model(w.build(), w.spec, options, model_name=w.model)
        profile.save(str(out / f"profile_{name}.json"))
        took = time.time() - began
        for variant in variants:
            graphed, m, offload = VARIANTS[variant]
            strategy = Strategy(kind="single", cuda_graphs=graphed, microbatches=m, offload=offload)
            pred = predict(profile, cluster, strategy, batch, optimizer="adam", uneven=True)
            snap = out / f"{name}_{variant}.pickle.gz"
            job = TrainJob(
                plan=make_plan("1f1b", 1, m),
                partition=from_boundaries([0, profile.num_blocks], ranks=1),
                batch=batch,
                workload=w,
                config=RunConfig(
                    dtype="bf16", optimizer="adam", cuda_graphs=graphed, offload=offload
                ),
                device="cuda",
                steps=DUMP_AT + 1,
                warmup_steps=0,
                exact_init=False,
                before_step=partial(record_hook, path=str(snap)),
            )
            result = run_job(job)
            assert result is not None
            summary = result.summary
            row = {
                "workload": name,
                "variant": variant,
                "predicted": pred.peak_memory,
                "allocated": max(summary["peak_allocated"]),
                "reserved": max(summary["peak_reserved"]),
                "step_ms": summary["step_time"] * 1e3,
                "profile_s": took,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame of pipecast's or torch's own code that made an allocation."""
    for f in frames:
        name = f.get("filename", "")
        if "pipecast" in name or "/torch/optim" in name or "/torch/nn/" in name:
            return f"{Path(name).name}:{f.get('name', '?')}"
    return "other"


def analyze(path: Path, top: int = 12) -> None:
    with gzip.open(path, "rb") as fh:
        snap = pickle.load(fh)
    trace = snap["device_traces"][0]
    live: dict[int, tuple[int, str]] = {}
    now = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for e in trace:
        action, addr, size = e["action"], e["addr"], e["size"]
        if action == "alloc":
            live[addr] = (size, _where(e.get("frames", [])))
            now += size
            if now > peak:
                peak, at_peak = now, dict(live)
        elif action == "free_completed" and addr in live:
            now -= live.pop(addr)[0]
    by_where: collections.Counter[str] = collections.Counter()
    for size, where in at_peak.values():
        by_where[where] += size
    pools: collections.Counter[str] = collections.Counter()
    used: collections.Counter[str] = collections.Counter()
    for seg in snap["segments"]:
        pool = "graph pool" if seg.get("segment_pool_id", (0, 0)) != (0, 0) else "default"
        pools[f"{pool} {seg['segment_type']}"] += seg["total_size"]
        used[f"{pool} {seg['segment_type']}"] += seg["allocated_size"]
    peaks = snap.get("pipecast_peaks", {})
    base = peaks.get("baseline", 0)
    print(f"{path.name}: peak allocated {peaks.get('allocated', 0) / 2**20:.1f} MiB, reserved "
          f"{peaks.get('reserved', 0) / 2**20:.1f} MiB; before the first step "
          f"{base / 2**20:.1f} MiB, traced peak above it {peak / 2**20:.1f} MiB")  # fmt: skip
    for where, size in by_where.most_common(top):
        print(f"  {size / 2**20:10.1f} MiB  {where}")
    for pool, size in sorted(pools.items()):
        print(f"  segments {pool}: {size / 2**20:.1f} MiB reserved, {used[pool] / 2**20:.1f} used")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--workloads", default=",".join(WORKLOADS))
    r.add_argument("--variants", default="graphed", help=", ".join(VARIANTS))
    a = sub.add_parser("analyze")
    a.add_argument("snapshots", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.what == "run":
        args.out.mkdir(parents=True, exist_ok=True)
        rows = run(args.out, args.workloads.split(","), args.variants.split(","))
        (args.out / "memory_terms.json").write_text(json.dumps(rows, indent=1))
        return 0
    for path in args.snapshots:
        analyze(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
