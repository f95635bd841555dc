"""Does where a rank's host runs explain its slow spells? (issue 7's host-bound misses)

The same configuration measured minutes apart on one machine moved by up to 2x where the host
binds, and the fixed pure-Python loop of `pipecast.hardware.hostspeed` read ~8.5 ms in some
spells and ~14 ms in others. This script asks whether those spells belong to CPUs:

1. the machine's CPU topology (cores, hyperthreads, each GPU's NUMA node);
2. the loop pinned to each CPU in turn, several sweeps: is a CPU's speed its own, and steady?
3. the loop unpinned and pinned to one CPU, sample by sample, with the CPU each sample ran on;
4. with 2+ GPUs: host-bound rows through the runtime with each rank on its GPU's node
   (`PIPECAST_CPU_BIND=node`, the default), on its own share of whole cores (`rank`) and
   on the first N cores of that share (`rank:N`), the policies in turn over several
   rounds; in every rank, before the rows, the host cost of a whole backward on a tiny
   graph (back to back, and with the host asleep 0.5 ms between calls), and each rank's
   loop speed and CPU before every row.

    OUT=/tmp/cpus python3 benchmarks/host_cpus.py [--dry-run] [--modes node,rank,rank:1]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import time
from dataclasses import replace
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import dump, log, pack, two_gpu_rows

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.hardware import cpubind, devices, hostspeed
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.worker import run_rank

_libc = ctypes.CDLL(None)


def on_cpu() -> int:
    return int(_libc.sched_getcpu())


def loop_ms() -> float:
    return hostspeed.reference(repeats=1) * 1e3


def facts() -> dict[str, Any]:
    allowed = sorted(os.sched_getaffinity(0))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "allowed": len(allowed),
        "cores": [sorted(c) for c in cpubind.cores(allowed)],
        "gpu_local_cpus": [
            sorted(devices.local_cpus(torch.device("cuda", i))) for i in range(gpus)
        ],
        "rank_cpus": [
            sorted(devices.rank_cpus(torch.device("cuda", i), gpus)) for i in range(gpus)
        ],
    }
    for cmd in (["lscpu"], ["nvidia-smi", "topo", "-m"]):
        try:
            out[cmd[0]] = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            out[cmd[0]] = f"unavailable: {exc}"
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        out["cpuinfo_mhz"] = [min(mhz), statistics.median(mhz), max(mhz)] if mhz else []
    except OSError:
        pass
    return out


def sweeps(count: int) -> list[dict[str, Any]]:
    """The loop pinned to each allowed CPU in turn, `count` sweeps (median of 3 per CPU)."""
    before = os.sched_getaffinity(0)
    out = []
    try:
        for s in range(count):
            began = time.time()
            per = {}
            for cpu in sorted(before):
                os.sched_setaffinity(0, {cpu})
                per[cpu] = round(statistics.median(loop_ms() for _ in range(3)), 2)
            out.append({"sweep": s, "seconds": round(time.time() - began, 1), "ms": per})
            values = list(per.values())
            log(
                f"sweep {s}: loop {min(values):.1f}-{max(values):.1f} ms over "
                f"{len(values)} CPUs, median {statistics.median(values):.1f}"
            )
    finally:
        os.sched_setaffinity(0, before)
    return out


def series(seconds: float, cpus: set[int] | None) -> list[list[float]]:
    """[seconds since start, loop ms, CPU] samples for `seconds`, on `cpus` (None: as given)."""
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    out = []
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            ms = loop_ms()
            out.append([round(time.perf_counter() - start, 3), round(ms, 2), on_cpu()])
    finally:
        os.sched_setaffinity(0, before)
    values = [v for _, v, _ in out]
    log(
        f"series on {'all' if not cpus else sorted(cpus)}: {len(values)} samples, "
        f"{min(values):.1f}-{max(values):.1f} ms, quartiles "
        f"{[round(q, 1) for q in statistics.quantiles(values, n=4)]}, "
        f"{len({c for *_, c in out})} CPUs seen"
    )
    return out


M_SMALL = (1, 4, 16)


def call_us(device: torch.device, pause_s: float, calls: int = 200) -> float:
    """Median host microseconds of a whole backward through one small Linear, with the host
    asleep `pause_s` between calls (the runtime's other work lets autograd's thread idle)."""
    layer = torch.nn.Linear(64, 64, device=device)
    x = torch.randn(8, 64, device=device)
    times = []
    for i in range(calls + 10):
        loss = layer(x).sum()
        if pause_s:
            time.sleep(pause_s)
        began = time.perf_counter()
        loss.backward()
        if i >= 10:
            times.append(time.perf_counter() - began)
    devices.synchronize(device)
    return round(statistics.median(times) * 1e6, 1)


def rows(dry: bool) -> list[BenchConfig]:
    shared = two_gpu_rows("host-cpus", dry)
    out = [replace(shared["vggc"], microbatches=m) for m in M_SMALL]
    return [*out, shared["gpt"], replace(shared["r50"], schedule="zb-h1")]


def _rank(ctx: Context, configs: list[BenchConfig]) -> dict[str, Any]:
    calls = {"back_to_back": call_us(ctx.device, 0.0), "paused": call_us(ctx.device, 5e-4)}
    out = []
    for cfg in configs:
        host = [loop_ms() for _ in range(3)]
        cpu = on_cpu()
        report = run_rank(ctx, pipecast_job(cfg))
        times = sorted(s.seconds for s in report.steps)
        out.append(
            {
                "label": cfg.label(),
                "step_ms": times[len(times) // 2] * 1e3,
                "loop_ms_before": round(statistics.median(host), 2),
                "cpu": cpu,
                "cpu_after": on_cpu(),
                "allowed": len(os.sched_getaffinity(0)),
            }
        )
    return {"rows": out, "call_us": calls}


def runtime_rounds(dry: bool, rounds: int, modes: list[str]) -> list[dict[str, Any]]:
    configs = rows(dry)
    out = []
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            os.environ[cpubind.ENV] = mode
            began = time.time()
            results = spawn(_rank, 2, (configs,), backend="gloo" if dry else "nccl", timeout_s=200)
            ranks = [res["rows"] for res in results]
            calls = [res["call_us"] for res in results]
            log(f"round {r} {mode}: whole-backward call us per rank {calls}")
            out.append({"round": r, "mode": mode, "call_us": calls})
            for i, cfg in enumerate(configs):
                step = max(rank[i]["step_ms"] for rank in ranks)
                per_rank = [
                    {k: rank[i][k] for k in ("loop_ms_before", "cpu", "cpu_after", "allowed")}
                    for rank in ranks
                ]
                log(f"round {r} {mode:4s} {cfg.label()}: {step:.1f} ms; ranks {per_rank}")
                out.append(
                    {
                        "round": r,
                        "mode": mode,
                        "label": cfg.label(),
                        "step_ms": step,
                        "ranks": per_rank,
                    }
                )
            log(f"round {r} {mode}: {time.time() - began:.1f} s")
    os.environ.pop(cpubind.ENV, None)
    return out


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[str, list[float]]] = {}
    for row in results:
        if "label" not in row:
            continue
        by.setdefault(row["label"], {}).setdefault(row["mode"], []).append(row["step_ms"])
    return {
        label: {
            mode: {
                "median": round(statistics.median(v), 2),
                "min": round(min(v), 2),
                "max": round(max(v), 2),
            }
            for mode, v in modes.items()
        }
        for label, modes in by.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sweeps", type=int, default=4)
    ap.add_argument("--series-s", type=float, default=10.0)
    ap.add_argument("--modes", default="node,rank", help="PIPECAST_CPU_BIND values, in turn")
    args = ap.parse_args()
    result: dict[str, Any] = {"facts": facts()}
    log(f"facts: {result['facts']['cpu_count']} CPUs, {len(result['facts']['cores'])} cores")
    dump("host_cpus.json", result)
    result["sweeps"] = sweeps(args.sweeps)
    dump("host_cpus.json", result)
    first = min(os.sched_getaffinity(0))
    if args.series_s > 0:
        result["series_unpinned"] = series(args.series_s, None)
        result["series_one_cpu"] = series(args.series_s, {first})
    dump("host_cpus.json", result)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.dry_run or gpus >= 2:
        result["runtime"] = runtime_rounds(args.dry_run, args.rounds, args.modes.split(","))
        result["summary"] = summary(result["runtime"])
        log(f"summary: {result['summary']}")
    dump("host_cpus.json", result)
    log("done")


if __name__ == "__main__":
    try:
        main()
    finally:
        pack()
