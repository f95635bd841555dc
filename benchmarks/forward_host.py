"""Does a stage's forward cost its host more inside the pipeline than alone, and than the
profile's kind of reading says?

On h100x4-graphs-run2 and three runs before it, GPT's forward of 6 layers at micro-batch 2
cost a pipeline rank's host 4.4-6.4 ms beyond the runtime's own overhead, 1.0-2.9x what the
profile predicted, and it is CPU work (thread CPU seconds equal wall seconds), not waiting.
Zero-bubble rows, where the host binds, miss by that much. Which step adds it?

Every rank builds its stage of the suite's 4-stage GPT split (6 layers, micro-batch 2,
bf16) and times, host ms per forward:

* `loop`: M forwards back to back, each rank in turn while the others sleep (as the
  profiler runs: one process busy);
* `loop_together`: the same with every rank at once (the probe's busy count);
* `alternating`: every rank at once, each forward followed by that micro-batch's whole
  backward (a pipeline's steady state without transfers);
* `pipeline_1f1b`, `pipeline_zb-h1`: the runtime's own host time per forward action over
  all ranks (M=16), as the bench records it, and its thread CPU share;

and rank 0 times the whole model's forward at micro-batches 1 and 2 in passes with a
backward between them, as the profiler's plain passes do (`whole_mb1`, `whole_mb2`, per 6
layers). Three rounds.

    cd benchmarks && OUT=/tmp/f python3 forward_host.py      (--dry-run: tiny GPT on CPU)

Writes forward_host.json and logs every reading.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import OUT, dump, log

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.bench.suites import GPT
from pipecast.bench.timing import action_stats
from pipecast.hardware import devices
from pipecast.models.workload import Workload
from pipecast.runtime.backward import backward_full
from pipecast.runtime.config import RunConfig
from pipecast.runtime.launch import Context, all_gather_floats, spawn
from pipecast.runtime.stage import StageModule, materialize
from pipecast.runtime.worker import run_rank

DRY = "--dry-run" in sys.argv or not torch.cuda.is_available()
if DRY:
    WORKLOAD = Workload(
        model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
    )
    BOUNDS, DTYPE, DEVICE = (0, 2, 4, 6, 8), "fp32", "cpu"
else:
    WORKLOAD, BOUNDS, DTYPE, DEVICE = GPT, (0, 6, 12, 18, 24), "bf16", "cuda"
MICRO, M, REPEATS = 2, 16, 5
WORLD = len(BOUNDS) - 1


def _device(ctx: Context) -> torch.device:
    return ctx.device if DEVICE == "cuda" else torch.device("cpu")


def _input(device: torch.device) -> torch.Tensor:
    dtype = devices.DTYPES[DTYPE] if DTYPE != "fp32" else torch.float32
    return torch.randn(MICRO, *WORKLOAD.spec.sample_shape, device=device, dtype=dtype)


def _stage(ctx: Context) -> StageModule:
    device = _device(ctx)
    blocks = materialize(WORKLOAD.build("meta")[BOUNDS[ctx.rank] : BOUNDS[ctx.rank + 1]], device)
    return StageModule(
        ctx.rank,
        blocks,
        device,
        RunConfig(dtype=DTYPE),  # type: ignore[arg-type]
        first=ctx.rank == 0,
        last=ctx.rank == WORLD - 1,
    )


def _forwards(st: StageModule, x: torch.Tensor, *, backward: bool) -> float:
    """Host seconds per forward over M of them: kept until the end, or (`backward`) each
    followed by its whole backward, which is not timed."""
    times, kept = [], []
    seed = torch.ones_like(x)
    for _ in range(M):
        leaf = x.detach().requires_grad_(not st.first)
        began = time.perf_counter()
        out = st.forward(leaf)
        times.append(time.perf_counter() - began)
        if backward:
            backward_full(out, seed, None if st.first else leaf, st.params)
        else:
            kept.append(out)
    del kept
    devices.synchronize(x.device)
    for p in st.params:
        p.grad = None
    return statistics.mean(times)


def _readings(ctx: Context) -> dict[str, float]:
    """This rank's `loop` (in turn), `loop_together` and `alternating` ms per forward
    (medians of REPEATS after a warm-up each), and rank 0's whole-model readings."""
    st, x = _stage(ctx), _input(_device(ctx))
    out: dict[str, list[float]] = {"loop": [], "loop_together": [], "alternating": []}
    for repeat in range(REPEATS + 1):
        for turn in range(WORLD):  # each rank alone, the others asleep
            all_gather_floats([0.0], ctx.device)
            if turn == ctx.rank:
                reading = _forwards(st, x, backward=False)
                if repeat:
                    out["loop"].append(reading)
            else:
                time.sleep(0.05)
        all_gather_floats([0.0], ctx.device)
        together = _forwards(st, x, backward=False)
        all_gather_floats([0.0], ctx.device)
        alternating = _forwards(st, x, backward=True)
        if repeat:
            out["loop_together"].append(together)
            out["alternating"].append(alternating)
    result = {k: statistics.median(v) * 1e3 for k, v in out.items()}
    del st
    all_gather_floats([0.0], ctx.device)
    if ctx.rank == 0:
        result |= _whole(_device(ctx))
    all_gather_floats([0.0], ctx.device)
    return result


def _whole(device: torch.device) -> dict[str, float]:
    """The whole model's forward, host ms per 6 layers' share, in passes with a backward
    between them, at micro-batches 1 and 2 (medians of REPEATS after one)."""
    model = materialize(WORKLOAD.build("meta"), device)
    dtype = devices.DTYPES[DTYPE] if DTYPE != "fp32" else torch.float32
    model = model.to(dtype)
    share = (BOUNDS[1] - BOUNDS[0]) / BOUNDS[-1]
    out = {}
    for mb in (1, 2):
        x = torch.randn(mb, *WORKLOAD.spec.sample_shape, device=device, dtype=dtype)
        times = []
        for _ in range(REPEATS + 1):
            began = time.perf_counter()
            y = model(x)
            times.append(time.perf_counter() - began)
            y.float().sum().backward()
            devices.synchronize(device)
        for p in model.parameters():
            p.grad = None
        out[f"whole_mb{mb}"] = statistics.median(times[1:]) * share * 1e3
    return out


def _pipeline(ctx: Context, cfg: BenchConfig) -> dict[str, float]:
    report = run_rank(ctx, pipecast_job(cfg))
    stats = action_stats(report.steps, report.events)
    return {"host": stats["host_F"] / M * 1e3, "cpu": stats["cpu_F"] / M * 1e3}


def _config(schedule: str) -> BenchConfig:
    return BenchConfig(
        suite="forward-host",
        system="pipecast",
        workload=WORKLOAD,
        gpus=WORLD,
        batch=MICRO * M,
        schedule=schedule,
        microbatches=M,
        boundaries=BOUNDS,
        dtype=DTYPE,  # type: ignore[arg-type]
        device=DEVICE,  # type: ignore[arg-type]
    )


def main() -> None:
    backend = "nccl" if DEVICE == "cuda" else "gloo"
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    log(f"{WORLD} x {name}, torch {torch.__version__}, split {BOUNDS}, micro-batch {MICRO}")
    result: dict[str, Any] = {"device": name, "torch": torch.__version__, "rounds": []}
    for round_ in range(3):
        ranks = spawn(_readings, WORLD, (), backend=backend, timeout_s=600)
        row: dict[str, Any] = {"round": round_, "ranks": ranks}
        for schedule in ("1f1b", "zb-h1"):
            row[f"pipeline_{schedule}"] = spawn(
                _pipeline, WORLD, (_config(schedule),), backend=backend, timeout_s=600
            )
        result["rounds"].append(row)
        per_rank = [
            {
                **{k: round(v, 2) for k, v in r.items()},
                **{
                    f"pipeline_{s}": round(row[f"pipeline_{s}"][i]["host"], 2)
                    for s in ("1f1b", "zb-h1")
                },
            }
            for i, r in enumerate(ranks)
        ]
        log(f"round {round_}: ms per forward by rank {per_rank}")
        dump("forward_host.json", result)
    log(f"wrote {OUT / 'forward_host.json'}")


if __name__ == "__main__":
    main()
