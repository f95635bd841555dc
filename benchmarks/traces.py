"""Trace systems rank by rank on the same configuration, in one world.

Each configuration runs as the bench runs it (pipecast.bench.runner.run_config); the last
timed step of the ones marked for tracing runs under torch.profiler on every rank, and each
rank's trace is written gzipped with a summary: the step's span on the device, the time some
compute kernel ran, the time NCCL kernels ran, the idle time between, and the host's CUDA
runtime calls by name.

    python -m benchmarks.traces --set vgg --out DIR      # on a machine with 2 GPUs
    python -m benchmarks.traces --summarize DIR          # the summaries of traces written
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pipecast.bench import runner, timing
from pipecast.bench.config import BenchConfig
from pipecast.bench.suites import GPT, LENET, VGG16
from pipecast.runtime import worker
from pipecast.runtime.launch import Context, spawn

_TRACE: dict[str, Any] = {}
"""The step to trace and the profiler running it, on this rank."""


@contextmanager
def _traced_step(step: int) -> Iterator[None]:
    """Trace step `step` of whatever runs inside (counting the runner's barrier pairs)."""
    calls = {"n": 0}
    plain_timing, plain_worker = timing.barrier, worker._barrier

    def toggle(after: Callable[[], None]) -> None:
        n = calls["n"]
        calls["n"] += 1
        after()
        if n == 2 * step:
            prof = torch.profiler.profile(
                activities=[
                    torch.profiler.ProfilerActivity.CPU,
                    torch.profiler.ProfilerActivity.CUDA,
                ]
            )
            prof.start()
            _TRACE["prof"] = prof
        elif n == 2 * step + 1 and "prof" in _TRACE:
            _TRACE["prof"].stop()

    def timing_barrier(device: torch.device) -> None:
        toggle(lambda: plain_timing(device))

    def worker_barrier(ctx: Context, where: str) -> None:
        if where.startswith(("before step", "after step")):
            toggle(lambda: plain_worker(ctx, where))
        else:
            plain_worker(ctx, where)

    timing.barrier = timing_barrier  # type: ignore[assignment]
    worker._barrier = worker_barrier  # type: ignore[assignment]
    try:
        yield
    finally:
        timing.barrier, worker._barrier = plain_timing, plain_worker  # type: ignore[assignment]


def summarize(trace: dict[str, Any]) -> dict[str, Any]:
    """Device and host time of one traced step (a chrome trace as torch writes it)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        return {"kernels": 0}
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    compute = [e for e in kernels if "nccl" not in e["name"].lower()]
    begin = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    runtime: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            runtime.setdefault(e["name"], []).append(e["dur"])
    steps = [e for e in events if e.get("cat") == "user_annotation"]
    return {
        "kernels": len(kernels),
        "span_ms": (end - begin) / 1e3,
        "compute_busy_ms": _union(compute) / 1e3,
        "nccl_busy_ms": _union(nccl) / 1e3,
        "any_busy_ms": _union(kernels) / 1e3,
        "compute_gaps_over_50us": _gaps(compute, 50.0),
        "streams": sorted({str(e.get("tid")) for e in kernels}),
        "runtime_calls": {
            k: [len(v), round(sum(v) / 1e3, 3)]
            for k, v in sorted(runtime.items(), key=lambda kv: -sum(kv[1]))[:12]
        },
        "annotations": len(steps),
    }


def _union(events: list[dict[str, Any]]) -> float:
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in spans:
        if cur_b is None or a > cur_b:
            if cur_b is not None and cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_a is not None and cur_b is not None:
        total += cur_b - cur_a
    return total


def _gaps(events: list[dict[str, Any]], over_us: float) -> list[list[float]]:
    """Idle stretches of compute longer than `over_us`: [start from the first kernel, length]
    in microseconds, at most 40."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events)
    if not spans:
        return []
    origin, out, reach = spans[0][0], [], spans[0][1]
    for a, b in spans[1:]:
        if a - reach > over_us:
            out.append([round(reach - origin, 1), round(a - reach, 1)])
        reach = max(reach, b)
    return out[:40]


def _rank(ctx: Context, configs: list[tuple[str, BenchConfig, bool]], out: str) -> list[Any]:
    rows = []
    for name, cfg, traced in configs:
        step = cfg.warmup + cfg.steps - 1
        began = time.time()
        try:
            if traced:
                with _traced_step(step):
                    result = runner.run_config(ctx, cfg)
            else:
                result = runner.run_config(ctx, cfg)
            error = None
        except Exception as exc:
            result, error = {}, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        worker.release_earlier_jobs(ctx.device)
        prof = _TRACE.pop("prof", None)
        summary: dict[str, Any] = {}
        if prof is not None:
            path = Path(out) / f"{name}.r{ctx.rank}.json"
            prof.export_chrome_trace(str(path))
            data = json.loads(path.read_text())
            summary = summarize(data)
            with gzip.open(f"{path}.gz", "wt") as fh:
                json.dump(data, fh)
            path.unlink()
        rows.append(
            {
                "name": name,
                "label": cfg.label(),
                "rank": ctx.rank,
                "step_ms": 1e3 * result.get("step_time", 0.0),
                "samples_per_s": cfg.batch / result["step_time"] if result else 0.0,
                "peak_gib": [b / 2**30 for b in result.get("peak_allocated", [])],
                "error": error,
                "trace": summary,
                "wall_s": round(time.time() - began, 1),
            }
        )
        if ctx.rank == 0:
            print(json.dumps({k: rows[-1][k] for k in ("name", "step_ms", "error")}), flush=True)
    return rows


def vgg_set() -> list[tuple[str, BenchConfig, bool]]:
    base = BenchConfig(
        suite="traces", system="torch", workload=VGG16, gpus=2, batch=128, schedule="1f1b",
        microbatches=4, boundaries=(0, 10, 40), steps=4, warmup=2,
    )  # fmt: skip
    pc = replace(base, system="pipecast")
    return [
        ("vgg_single", replace(base, system="single", gpus=2, microbatches=1), False),
        ("vgg_torch_1f1b_m4", base, True),
        ("vgg_pc_1f1b_m4", pc, True),
        ("vgg_pc_1f1b_m4_eager", replace(pc, send_timing="eager"), True),
        ("vgg_pc_1f1b_m4_graphs", replace(pc, cuda_graphs=True), True),
        ("vgg_pc_zbh1_m4", replace(pc, schedule="zb-h1"), False),
        ("vgg_torch_1f1b_m8", replace(base, microbatches=8), False),
        ("vgg_ddp", replace(base, system="ddp", microbatches=1), False),
    ]


def gpt_set() -> list[tuple[str, BenchConfig, bool]]:
    base = BenchConfig(
        suite="traces", system="torch", workload=GPT, gpus=2, batch=32, schedule="1f1b",
        microbatches=8, boundaries=(0, 12, 24), steps=3, warmup=2,
    )  # fmt: skip
    pc = replace(base, system="pipecast")
    return [
        ("gpt_single", replace(base, system="single", microbatches=1), False),
        ("gpt_torch_1f1b_m8", base, True),
        ("gpt_pc_1f1b_m8", pc, True),
        ("gpt_pc_zbh1_m8", replace(pc, schedule="zb-h1"), True),
        ("gpt_pc_zbh1_m16", replace(pc, schedule="zb-h1", microbatches=16), True),
        ("gpt_pc_1f1b_m16", replace(pc, microbatches=16), False),
        ("gpt_pc_1f1b_m16_graphs", replace(pc, microbatches=16, cuda_graphs=True), False),
    ]


def smoke_set() -> list[tuple[str, BenchConfig, bool]]:
    """LeNet-5 on 2 CPU ranks: the tool's own check, on any machine."""
    base = BenchConfig(
        suite="traces", system="torch", workload=LENET, gpus=2, batch=32, schedule="1f1b",
        microbatches=4, boundaries=(0, 6, 12), steps=2, warmup=1, device="cpu", dtype="fp32",
    )  # fmt: skip
    return [("smoke_torch", base, True), ("smoke_pc", replace(base, system="pipecast"), True)]


SETS = {"vgg": vgg_set, "gpt": gpt_set, "smoke": smoke_set}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", choices=sorted(SETS), default=[])
    parser.add_argument("--out", default=os.environ.get("OUT", "traces-out"))
    parser.add_argument("--summarize", metavar="DIR", help="summarize the traces in DIR")
    args = parser.parse_args(argv)
    if args.summarize:
        for path in sorted(Path(args.summarize).glob("*.json.gz")):
            with gzip.open(path, "rt") as fh:
                print(path.name, json.dumps(summarize(json.load(fh))))
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    configs = [c for s in args.set or sorted(SETS) for c in SETS[s]()]
    gpus, device = configs[0][1].gpus, configs[0][1].device
    backend = "nccl" if device == "cuda" else "gloo"
    results = spawn(_rank, gpus, (configs, args.out), backend=backend, timeout_s=600)
    rows = [row for rank in results for row in rank]
    out = Path(args.out)
    (out / "traces.json").write_text(json.dumps(rows, indent=1))
    with tarfile.open(out / "traces.tar", "w") as tar:  # a device hands back few files
        for path in sorted(out.glob("*.json.gz")):
            tar.add(path, arcname=path.name)
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
