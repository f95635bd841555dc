"""Where does a host-bound step lose its time? The same host-bound work (VGG-16 on CIFAR-10,
micro-batches of 4, 8 per step, bf16) timed in the profiler's context (the driver process)
and in the bench's (a rank spawned with an NCCL process group), with a pure-Python reference
in each, then through pipecast's runtime on that rank, with and without its action clock.

    cd benchmarks && OUT=/tmp/r python3 host_context.py     (on a CPU: the same, in fp32 and gloo)

Writes host_context.json: seconds per step (median of 10 after 3 warm-ups) per context.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.data import get_spec
from pipecast.data.loss import loss_for
from pipecast.data.synthetic import synthetic_batch
from pipecast.hardware import devices
from pipecast.models.workload import Workload
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.worker import run_rank

OUT = Path(os.environ.get("OUT", "."))
WORKLOAD = Workload(model="vgg16", dataset="cifar10")
MICRO, M, STEPS, WARMUP = 4, 8, 10, 3


def python_reference() -> float:
    """Seconds of a fixed pure-Python loop (no CUDA): how fast this process's host runs."""
    times = []
    for _ in range(7):
        began = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i % 7
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def plain_steps(device: torch.device, *, gc_off: bool) -> float:
    """Median seconds of a plain accumulation step: M x (forward, loss, backward)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = WORKLOAD.build().to(device, dtype)
    spec = get_spec(WORKLOAD.dataset)
    x, target = synthetic_batch(spec, MICRO, seed=0, dtype=dtype)
    x, target = x.to(device), target.to(device)
    loss_fn = loss_for(spec)
    was = gc.isenabled()
    if gc_off:
        gc.disable()
    times = []
    try:
        for i in range(WARMUP + STEPS):
            devices.synchronize(device)
            began = time.perf_counter()
            for _ in range(M):
                loss_fn(model(x), target).backward()
            devices.synchronize(device)
            if i >= WARMUP:
                times.append(time.perf_counter() - began)
    finally:
        if was:
            gc.enable()
    return statistics.median(times)


def measure(device: torch.device) -> dict[str, float]:
    with devices.pinned(device):
        return {
            "python_ref": python_reference(),
            "plain_gc_on": plain_steps(device, gc_off=False),
            "plain_gc_off": plain_steps(device, gc_off=True),
            "python_ref_after": python_reference(),
        }


def on_ranks(ctx: Context) -> dict[str, float]:
    """Every rank of the world times the plain step at once (hosts busy side by side)."""
    return measure(ctx.device)


def runtime_job(device: torch.device, *, clock: bool) -> TrainJob:
    """The same work through pipecast's runtime on one rank (one stage, GPipe, M
    micro-batches), with its action clock on or off."""
    cfg = BenchConfig(
        suite="host",
        system="pipecast",
        workload=WORKLOAD,
        gpus=1,
        batch=MICRO * M,
        microbatches=M,
        boundaries=(0, 40),
        schedule="gpipe",
        steps=STEPS,
        warmup=WARMUP,
        device=device.type,
        dtype="bf16" if device.type == "cuda" else "fp32",
    )
    job = pipecast_job(cfg)
    return replace(job, config=replace(job.config, record_events=clock))


def on_rank(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = measure(ctx.device)
    for clock in (True, False):
        job = runtime_job(ctx.device, clock=clock)
        report = run_rank(ctx, job)
        out[f"runtime_clock_{'on' if clock else 'off'}"] = statistics.median(
            s.seconds for s in report.steps
        )
        out[f"runtime_loop_{'on' if clock else 'off'}"] = statistics.median(
            s.host_loop for s in report.steps
        )
    return out


def main() -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    result: dict[str, Any] = {"torch": torch.__version__, "gpu": devices.name(device)}
    phases = [
        ("driver", lambda: measure(device)),
        ("rank_alone", lambda: spawn(on_rank, 1, backend=backend, timeout_s=300)[0]),
        ("driver_again", lambda: measure(device)),
    ]
    if cuda and torch.cuda.device_count() >= 2:
        phases.append(("ranks_two", lambda: spawn(on_ranks, 2, backend=backend, timeout_s=300)))
    for name, run in phases:  # written after each phase: a phase that fails loses only itself
        result[name] = run()
        (OUT / "host_context.json").write_text(json.dumps(result, indent=1))
        print(name, json.dumps(result[name]), flush=True)


if __name__ == "__main__":
    main()
