"""Trace systems rank by rank on the same configuration, in one world.

Each configuration runs as the bench runs it (pipecast.orchestration.bench.runner.run_config); the
last timed step of the ones marked for tracing runs under torch.profiler on every rank, and each
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

from pipecast.orchestration.bench import runner, timing
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.suites import GPT, LENET, VGG16
from pipecast.runtime import worker
from pipecast.runtime.launch import Context, spawn
from pipecast.values.models.workload import Workload

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
            result, error = {}, f"{type(exc).__name__}: {str(exc)[:300]}"
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
                "began": began,
            }
        )
        if ctx.rank == 0:  # as it goes: a call cut short still shows what it measured
            print(f"{name:32s} {rows[-1]['step_ms']:9.2f} ms  {error or ''}", flush=True)
    return rows


def vgg_set() -> list[tuple[str, BenchConfig, bool]]:
    """VGG-16, batch 128, 2 GPUs: torch.distributed.pipelining and pipecast on one split,
    pipecast eager and graphed, and pipecast's zero-bubble schedule on other splits."""
    base = BenchConfig(
        suite="traces", system="torch", workload=VGG16, gpus=2, batch=128, schedule="1f1b",
        microbatches=4, boundaries=(0, 10, 40), steps=4, warmup=2,
    )  # fmt: skip
    pc = replace(base, system="pipecast")
    g = replace(pc, cuda_graphs=True)
    return [
        ("vgg_single", replace(base, system="single", microbatches=1), False),
        ("vgg_ddp", replace(base, system="ddp", microbatches=1), False),
        ("vgg_torch_1f1b_m4", base, True),
        ("vgg_torch_gpipe_m4", replace(base, schedule="gpipe"), False),
        ("vgg_torch_1f1b_m8", replace(base, microbatches=8), False),
        ("vgg_pc_1f1b_m4", pc, False),
        ("vgg_pc_1f1b_m4_g", g, True),
        ("vgg_pc_zbh1_m4_g", replace(g, schedule="zb-h1"), True),
        ("vgg_pc_zbh1_m4_g_s8", replace(g, schedule="zb-h1", boundaries=(0, 8, 40)), False),
        ("vgg_pc_zbh1_m4_g_s9", replace(g, schedule="zb-h1", boundaries=(0, 9, 40)), False),
        (
            "vgg_pc_zbh1_m8_g_s9",
            replace(g, schedule="zb-h1", microbatches=8, boundaries=(0, 9, 40)),
            False,
        ),
        ("vgg_pc_1f1b_m4_g_s9", replace(g, boundaries=(0, 9, 40)), False),
    ]


def gpt_set() -> list[tuple[str, BenchConfig, bool]]:
    """The GPT stack, batch 32, 2 GPUs: torch.distributed.pipelining's schedules and
    pipecast's graphed ones at 8 to 32 micro-batches."""
    base = BenchConfig(
        suite="traces", system="torch", workload=GPT, gpus=2, batch=32, schedule="1f1b",
        microbatches=8, boundaries=(0, 12, 24), steps=3, warmup=2,
    )  # fmt: skip
    four = (0, 6, 12, 18, 24)
    g = replace(base, system="pipecast", cuda_graphs=True)
    return [
        ("gpt_single", replace(base, system="single", microbatches=1), False),
        ("gpt_ddp", replace(base, system="ddp", microbatches=1), False),
        ("gpt_torch_1f1b_m8", base, False),
        ("gpt_torch_gpipe_m8", replace(base, schedule="gpipe"), False),
        ("gpt_torch_interleaved_m8", replace(base, schedule="interleaved", boundaries=four), False),
        ("gpt_torch_zbv_m8", replace(base, schedule="zb-v", boundaries=four), False),
        ("gpt_pc_1f1b_m8_g", g, False),
        ("gpt_pc_zbh1_m8_g", replace(g, schedule="zb-h1"), True),
        ("gpt_pc_zbh1_m16_g", replace(g, schedule="zb-h1", microbatches=16), True),
        ("gpt_pc_zbh1_m32_g", replace(g, schedule="zb-h1", microbatches=32), False),
        ("gpt_pc_1f1b_m16_g", replace(g, microbatches=16), False),
        ("gpt_pc_interleaved_m8_g", replace(g, schedule="interleaved", boundaries=four), False),
        ("gpt_pc_zbv_m8_g", replace(g, schedule="zb-v", boundaries=four), False),
        ("gpt_pc_zbh1_m8", replace(g, schedule="zb-h1", cuda_graphs=False), False),
    ]


def _gpt(**kw: object) -> BenchConfig:
    base = BenchConfig(
        suite="traces", system="torch", workload=GPT, gpus=2, batch=32, schedule="1f1b",
        microbatches=8, boundaries=(0, 12, 24), steps=3, warmup=2,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def _vgg(**kw: object) -> BenchConfig:
    base = BenchConfig(
        suite="traces", system="torch", workload=VGG16, gpus=2, batch=128, schedule="1f1b",
        microbatches=4, boundaries=(0, 10, 40), steps=4, warmup=2,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


FOUR = (0, 6, 12, 18, 24)


def gpt_base_set() -> list[tuple[str, BenchConfig, bool]]:
    """The GPT stack's baselines: one GPU, DDP and torch.distributed.pipelining."""
    return [
        ("gpt_single", _gpt(system="single", microbatches=1), False),
        ("gpt_ddp", _gpt(system="ddp", microbatches=1), False),
        ("gpt_torch_1f1b_m8", _gpt(), False),
        ("gpt_torch_gpipe_m8", _gpt(schedule="gpipe"), False),
        ("gpt_torch_interleaved_m8", _gpt(schedule="interleaved", boundaries=FOUR), False),
        ("gpt_torch_zbv_m8", _gpt(schedule="zb-v", boundaries=FOUR), False),
    ]


def gpt_policy_set() -> list[tuple[str, BenchConfig, bool]]:
    """The GPT stack on pipecast's runtime, graphed, and eager for comparison."""
    g = _gpt(system="pipecast", cuda_graphs=True, schedule="zb-h1")
    return [
        ("gpt_pc_zbh1_m8_eager", replace(g, cuda_graphs=False), False),
        ("gpt_pc_zbh1_m8_g", g, True),
        ("gpt_pc_zbh1_m8_g_es", replace(g, send_timing="eager"), False),
        ("gpt_pc_1f1b_m8_g", replace(g, schedule="1f1b"), False),
        ("gpt_pc_zbh1_m16_g", replace(g, microbatches=16), False),
        ("gpt_pc_zbh1_m32_g", replace(g, microbatches=32), False),
        ("gpt_pc_zbv_m8_g", replace(g, schedule="zb-v", boundaries=FOUR), False),
        ("gpt_pc_interleaved_m8_g", replace(g, schedule="interleaved", boundaries=FOUR), False),
    ]


def gpt_probe_set() -> list[tuple[str, BenchConfig, bool]]:
    """Why graphed kernels ran slower: one GPU eager and graphed at the same micro-batches,
    and the V schedule traced."""
    one = _gpt(system="pipecast", gpus=1, boundaries=(0, 24), schedule="1f1b")
    g = _gpt(system="pipecast", cuda_graphs=True, schedule="zb-h1")
    return [
        ("gpt1_torch_m1", _gpt(system="single", microbatches=1, gpus=1), False),
        ("gpt1_torch_m8", _gpt(system="single", microbatches=8, gpus=1), False),
        ("gpt1_pc_m8", one, False),
        ("gpt1_pc_m8_g", replace(one, cuda_graphs=True), True),
        ("gpt1_pc_m1_g", replace(one, cuda_graphs=True, microbatches=1), False),
        ("gpt_pc_zbv_m8_g", replace(g, schedule="zb-v", boundaries=FOUR), True),
        ("gpt_pc_zbh1_m8_g", g, False),
    ]


def gpt_runtime_set() -> list[tuple[str, BenchConfig, bool]]:
    """The GPT stack on pipecast's graphed runtime: every schedule at 8, 16 and 32
    micro-batches (sends posted at once), ZB-H1 at 8 also with planned sends and eager."""
    g = _gpt(system="pipecast", cuda_graphs=True, send_timing="eager")
    out = [
        ("gpt_pc_zbh1_m8_eager", replace(g, schedule="zb-h1", cuda_graphs=False), False),
        ("gpt_pc_zbh1_m8_g_planned", replace(g, schedule="zb-h1", send_timing="planned"), False),
        (
            "gpt_pc_interleaved_m8_g_planned",
            replace(g, schedule="interleaved", boundaries=FOUR, send_timing="planned"),
            False,
        ),
    ]
    for schedule, bounds in (
        ("zb-h1", (0, 12, 24)),
        ("1f1b", (0, 12, 24)),
        ("gpipe", (0, 12, 24)),
        ("interleaved", FOUR),
        ("zb-v", FOUR),
    ):
        for m in (8, 16, 32):
            name = f"gpt_pc_{schedule.replace('-', '')}_m{m}_g"
            cfg = replace(g, schedule=schedule, microbatches=m, boundaries=bounds)
            out.append((name, cfg, schedule == "zb-h1" and m == 8))
    return out


def _zbh1_splits(g: BenchConfig) -> list[tuple[str, BenchConfig, bool]]:
    """VGG-16's ZB-H1 on the splits around torch's (0,10,40), at M=4 and M=8."""
    zb = replace(g, schedule="zb-h1")
    return [
        ("vgg_pc_zbh1_m4_g_s9", replace(zb, boundaries=(0, 9, 40)), False),
        ("vgg_pc_zbh1_m4_g_s8", replace(zb, boundaries=(0, 8, 40)), False),
        ("vgg_pc_zbh1_m8_g_s9", replace(zb, microbatches=8, boundaries=(0, 9, 40)), False),
    ]


def vgg_runtime_set() -> list[tuple[str, BenchConfig, bool]]:
    """VGG-16 on pipecast's graphed runtime: torch's split and schedule, and ZB-H1 on
    splits around it."""
    g = _vgg(system="pipecast", cuda_graphs=True, send_timing="eager")
    return [
        ("vgg_pc_1f1b_m4_eager", replace(g, cuda_graphs=False, send_timing="planned"), False),
        ("vgg_pc_1f1b_m4_g", g, True),
        ("vgg_pc_1f1b_m4_g_planned", replace(g, send_timing="planned"), False),
        ("vgg_pc_zbh1_m4_g", replace(g, schedule="zb-h1"), False),
        *_zbh1_splits(g),
    ]


def last_set() -> list[tuple[str, BenchConfig, bool]]:
    """The runtime's open questions: the same split and schedule as torch's, twice each, and
    the zero-bubble schedules at 8 and 32 micro-batches."""
    vg = _vgg(system="pipecast", cuda_graphs=True, send_timing="eager")
    gg = _gpt(system="pipecast", cuda_graphs=True, send_timing="eager", schedule="zb-h1")
    return [
        ("vgg_torch_1f1b_m4", _vgg(), False),
        ("vgg_pc_1f1b_m4_g", vg, False),
        ("vgg_torch_1f1b_m4_again", _vgg(), False),
        ("vgg_pc_1f1b_m4_g_again", vg, False),
        ("vgg_pc_zbh1_m4_g", replace(vg, schedule="zb-h1"), False),
        ("gpt_torch_1f1b_m8", _gpt(), False),
        ("gpt_pc_zbh1_m8_g", gg, False),
        ("gpt_pc_zbh1_m32_g", replace(gg, microbatches=32), False),
    ]


def vgg_base_set() -> list[tuple[str, BenchConfig, bool]]:
    """VGG-16's baselines: one GPU, DDP and torch.distributed.pipelining."""
    return [
        ("vgg_single", _vgg(system="single", microbatches=1), False),
        ("vgg_ddp", _vgg(system="ddp", microbatches=1), False),
        ("vgg_torch_1f1b_m4", _vgg(), False),
        ("vgg_torch_1f1b_m8", _vgg(microbatches=8), False),
        ("vgg_torch_gpipe_m4", _vgg(schedule="gpipe"), False),
    ]


def vgg_policy_set() -> list[tuple[str, BenchConfig, bool]]:
    """VGG-16 on pipecast's runtime, graphed, and eager for comparison."""
    g = _vgg(system="pipecast", cuda_graphs=True)
    return [
        ("vgg_pc_1f1b_m4_eager", replace(g, cuda_graphs=False), False),
        ("vgg_pc_1f1b_m4_g", g, True),
        ("vgg_pc_1f1b_m4_g_es", replace(g, send_timing="eager"), False),
        ("vgg_pc_zbh1_m4_g", replace(g, schedule="zb-h1"), True),
        *_zbh1_splits(g),
    ]


def four_set() -> list[tuple[str, BenchConfig, bool]]:
    """The runtime's bars on 4 GPUs in one call: torch's 1F1B and ZB-V against pipecast's
    graphed schedules (GPT), the same split and schedule twice (VGG-16), then one GPU."""
    eight = tuple(3 * i for i in range(9))
    split = (0, 4, 10, 21, 40)
    g = _gpt(gpus=4, boundaries=FOUR)
    gg = replace(g, system="pipecast", cuda_graphs=True, send_timing="eager")
    v = _vgg(gpus=4, boundaries=split)
    vg = replace(v, system="pipecast", cuda_graphs=True, send_timing="eager")
    return [
        ("gpt4_torch_zbv_m8", replace(g, schedule="zb-v", boundaries=eight), False),
        ("gpt4_torch_1f1b_m8", g, False),
        ("gpt4_pc_zbh1_m8_g", replace(gg, schedule="zb-h1"), False),
        ("gpt4_pc_1f1b_m8_g", gg, False),
        ("gpt4_pc_zbv_m8_g", replace(gg, schedule="zb-v", boundaries=eight), False),
        ("gpt4_pc_zbh1_m32_g", replace(gg, schedule="zb-h1", microbatches=32), False),
        ("vgg4_torch_1f1b_m4", v, False),
        ("vgg4_pc_1f1b_m4_g", vg, False),
        ("vgg4_pc_zbh1_m4_g", replace(vg, schedule="zb-h1"), False),
        ("vgg4_torch_1f1b_m4_again", v, False),
        ("gpt_single", _gpt(system="single", gpus=1, microbatches=1), False),
    ]


def stream_set() -> list[tuple[str, BenchConfig, bool]]:
    """Streamed weights on one GPU (8 TransformerEncoderLayers, d=2048, batch 16, Adam, 4
    micro-batches): the optimizer alone on the host, then activations, weights and both, to
    see where the step time of streaming goes."""
    w = Workload(
        model="transformer", dataset="embeddings", seq_len=1024, width=2048, layers=8, heads=16
    )
    base = BenchConfig(
        suite="traces", system="pipecast", workload=w, gpus=1, batch=16, schedule="1f1b",
        microbatches=4, boundaries=(0, 8), steps=3, warmup=2, optimizer="adam",
        offload="optimizer",
    )  # fmt: skip
    return [
        ("stream_optimizer_m4", base, True),
        ("stream_both_m4", replace(base, offload="both"), True),
        ("stream_weights_m4", replace(base, offload="weights"), True),
        ("stream_all_m4", replace(base, offload="all"), True),
        ("stream_all_m8", replace(base, offload="all", microbatches=8), False),
    ]


def smoke_set() -> list[tuple[str, BenchConfig, bool]]:
    """LeNet-5 on 2 CPU ranks: the tool's own check, on any machine."""
    base = BenchConfig(
        suite="traces", system="torch", workload=LENET, gpus=2, batch=32, schedule="1f1b",
        microbatches=4, boundaries=(0, 6, 12), steps=2, warmup=1, device="cpu", dtype="fp32",
    )  # fmt: skip
    return [("smoke_torch", base, True), ("smoke_pc", replace(base, system="pipecast"), True)]


SETS = {
    "vgg": vgg_set,
    "gpt": gpt_set,
    "gpt-base": gpt_base_set,
    "gpt-policy": gpt_policy_set,
    "gpt-probe": gpt_probe_set,
    "gpt-runtime": gpt_runtime_set,
    "last": last_set,
    "vgg-runtime": vgg_runtime_set,
    "vgg-base": vgg_base_set,
    "vgg-policy": vgg_policy_set,
    "smoke": smoke_set,
    "stream": stream_set,
    "four": four_set,
}


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
    rows = []
    for gpus in dict.fromkeys(c[1].gpus for c in configs):  # one world per GPU count
        group = [c for c in configs if c[1].gpus == gpus]
        backend = "nccl" if group[0][1].device == "cuda" else "gloo"
        results = spawn(_rank, gpus, (group, args.out), backend=backend, timeout_s=600)
        rows += [row for rank in results for row in rank]
    out = Path(args.out)
    (out / "traces.json").write_text(json.dumps(rows, indent=1))
    with tarfile.open(out / "traces.tar", "w") as tar:  # a device hands back few files
        for path in sorted(out.glob("*.json*")):
            tar.add(path, arcname=path.name)
            path.unlink()
    return 0  # rank 0 printed each row as it finished


if __name__ == "__main__":
    sys.exit(main())
