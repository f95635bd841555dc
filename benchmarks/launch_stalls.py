"""Does the host of a later rank wait in CUDA's launch calls? On h100x4-run7 and -run8 every
rank after the first spent 1.3-6.3x the first rank's host time per action on ResNet-50,
ResNet-18 and MobileNetV2 over 4 GPUs. One explanation (benchmarks/README.md, "Compute held
behind sends"): a device held behind a send lets its host run ahead until CUDA's launch queue
is full, and from there every launch waits for the device. This runs four of run 7's rows
under torch.profiler in every rank and reports, per rank, the host time in CUDA runtime calls
(kernel launches, event records, stream waits) per step, their count and their longest
single call: launches that wait for a full queue take milliseconds instead of microseconds.

    cd benchmarks && OUT=/tmp/l python3 launch_stalls.py     (--dry-run: tiny, on CPU ranks)
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from common import ROOT, dry_pipelines, dump, log, stored_configs

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.worker import run_rank

RUN = ROOT / "benchmarks" / "results" / "h100x4-run7" / "bench.sqlite"
WANTED = (
    ("resnet18", "imagenet", "1f1b", 4),
    ("resnet50", "imagenet", "1f1b", 8),
    ("vgg16", "cifar10", "gpipe", 32),
    ("vgg16", "imagenet", "1f1b", 8),  # device-bound, for contrast
)
CALLS = ("cudaLaunchKernel", "cudaEventRecord", "cudaStreamWaitEvent", "cudaLaunchKernelExC")


def chosen() -> list[BenchConfig]:
    """Run 7's 4-GPU pipecast rows of WANTED (the first of each)."""
    return stored_configs(RUN, WANTED, "stalls")


def dry_configs() -> list[BenchConfig]:
    return dry_pipelines("stalls", ("1f1b",))


def _rank(ctx: Context, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each configuration under torch.profiler on this rank: its step times and, per CUDA
    runtime call of CALLS, the host seconds per step, calls per step and the longest call."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    out = []
    for doc in configs:
        cfg = BenchConfig.from_dict(doc)
        job = pipecast_job(cfg)
        with torch.profiler.profile(activities=activities) as prof:
            report = run_rank(ctx, job)
        steps = job.warmup_steps + job.steps
        calls: dict[str, dict[str, float]] = {}
        for event in prof.events():
            if event.name in CALLS:
                c = calls.setdefault(event.name, {"seconds": 0.0, "count": 0.0, "longest": 0.0})
                seconds = event.time_range.elapsed_us() / 1e6
                c["seconds"] += seconds / steps
                c["count"] += 1 / steps
                c["longest"] = max(c["longest"], seconds)
        out.append(
            {
                "label": cfg.label(),
                "rank": ctx.rank,
                "step_times": [s.seconds for s in report.steps],
                "host_loop": [s.host_loop for s in report.steps],
                "calls": calls,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    dry = ap.parse_args().dry_run
    configs = dry_configs() if dry else chosen()
    log(f"{len(configs)} configurations: " + "; ".join(c.label() for c in configs))
    per_rank = spawn(
        _rank,
        configs[0].gpus,
        ([c.to_dict() for c in configs],),
        backend="gloo" if dry else "nccl",
        timeout_s=300,
    )
    dump("launch_stalls.json", per_rank)
    for i, cfg in enumerate(configs):
        log(cfg.label())
        for rank_rows in per_rank:
            row = rank_rows[i]
            steps = sorted(row["step_times"])
            text = " ".join(
                f"{name} {c['seconds'] * 1e3:.2f} ms/step in {c['count']:.0f} calls "
                f"(longest {c['longest'] * 1e3:.3f} ms);"
                for name, c in sorted(row["calls"].items())
            )
            log(
                f"  rank {row['rank']}: step {steps[len(steps) // 2] * 1e3:.2f} ms, "
                f"host loop {sorted(row['host_loop'])[len(steps) // 2] * 1e3:.2f} ms; {text}"
            )
    log("done")


if __name__ == "__main__":
    main()
