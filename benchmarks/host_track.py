"""Does a contemporaneous hostspeed.issue() reading track the host time the profiler reads?

The profiler reads a block's host cost in whole-model passes, one spell of the host per
micro-batch size, and takes the smallest size's reading. On h100x4-graphs-run2 GPT's
readings per 6 layers were 2.88, 5.69, 4.50 and 3.31 ms at micro-batches 1, 2, 4 and 8,
and its pipeline ranks then read 5.5-5.8 ms per forward: the smallest size had caught a
fast spell. If hostspeed.issue(), read beside each pass, moves with the pass's host time,
the profiler can state its readings at one reference speed, and spells cancel.

Each of the 4 ranks builds the suite's GPT (24 layers, bf16) and takes PAIRS pairs of
(issue reading; host ms of the whole model's forward at micro-batch 1 per 6 blocks, the
median of 5 passes with a backward between them, as the profiler's plain passes run):
first rank 0 alone while the others sleep, then all ranks at once. Per phase and rank:
the spread (CV) of the forward readings, of forward/issue, and their correlation.

    cd benchmarks && OUT=/tmp/t python3 host_track.py     (--dry-run: tiny GPT on CPU)

Writes host_track.json.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import OUT, dump, log

from pipecast.bench.suites import GPT
from pipecast.hardware import devices, hostspeed
from pipecast.models.workload import Workload
from pipecast.runtime.launch import Context, all_gather_floats, spawn
from pipecast.runtime.stage import materialize

DRY = "--dry-run" in sys.argv or not torch.cuda.is_available()
if DRY:
    WORKLOAD = Workload(
        model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
    )
    DEVICE, WORLD, PAIRS = "cpu", 2, 12
else:
    WORKLOAD, DEVICE, WORLD, PAIRS = GPT, "cuda", 4, 60
PASSES = 5


def _forward_ms(model: torch.nn.Module, x: torch.Tensor, share: float) -> float:
    times = []
    for _ in range(PASSES + 1):
        devices.synchronize(x.device)
        began = time.perf_counter()
        y = model(x)
        times.append(time.perf_counter() - began)
        y.float().sum().backward()
    devices.synchronize(x.device)
    for p in model.parameters():
        p.grad = None
    return statistics.median(times[1:]) * share * 1e3


def _pairs(ctx: Context) -> dict[str, list[list[float]]]:
    device = ctx.device if DEVICE == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    model = materialize(WORKLOAD.build("meta"), device).to(dtype)
    x = torch.randn(1, *WORKLOAD.spec.sample_shape, device=device, dtype=dtype)
    share = 6 / len(model)  # per 6 of GPT's 24 blocks, as the suite's 4-stage split
    _forward_ms(model, x, share)
    hostspeed.issue(device)
    out: dict[str, list[list[float]]] = {"alone": [], "together": []}
    for phase in ("alone", "together"):
        all_gather_floats([0.0], ctx.device)
        for _ in range(PAIRS):
            if phase == "alone" and ctx.rank:
                time.sleep(0.02)
                continue
            issue = hostspeed.issue(device) * 1e3
            out[phase].append([issue, _forward_ms(model, x, share)])
    all_gather_floats([0.0], ctx.device)
    return out


def _stats(pairs: list[list[float]]) -> dict[str, float]:
    issue, fwd = [p[0] for p in pairs], [p[1] for p in pairs]
    ratio = [f / i for i, f in pairs]

    def cv(v: list[float]) -> float:
        return statistics.stdev(v) / statistics.mean(v)

    li, lf = [math.log(v) for v in issue], [math.log(v) for v in fwd]
    return {
        "issue_ms": statistics.median(issue),
        "forward_ms": statistics.median(fwd),
        "forward_min_max": [min(fwd), max(fwd)],
        "cv_forward": cv(fwd),
        "cv_issue": cv(issue),
        "cv_ratio": cv(ratio),
        "corr_log": statistics.correlation(li, lf) if len(set(li)) > 1 else 0.0,
    }


def main() -> None:
    backend = "nccl" if DEVICE == "cuda" else "gloo"
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    log(f"{WORLD} x {name}, torch {torch.__version__}, {PAIRS} pairs per phase")
    ranks = spawn(_pairs, WORLD, (), backend=backend, timeout_s=600)
    result: dict[str, Any] = {"device": name, "torch": torch.__version__, "ranks": ranks}
    stats = {
        f"{phase}/rank{r}": _stats(rank[phase])
        for phase in ("alone", "together")
        for r, rank in enumerate(ranks)
        if rank[phase]
    }
    result["stats"] = stats
    for key, s in stats.items():
        log(
            f"{key}: issue {s['issue_ms']:.2f} ms, forward {s['forward_ms']:.2f} ms "
            f"({s['forward_min_max'][0]:.2f}-{s['forward_min_max'][1]:.2f}), CV forward "
            f"{s['cv_forward']:.1%}, issue {s['cv_issue']:.1%}, forward/issue "
            f"{s['cv_ratio']:.1%}, correlation of logs {s['corr_log']:+.2f}"
        )
    dump("host_track.json", result)
    log(f"wrote {OUT / 'host_track.json'}")


if __name__ == "__main__":
    main()
