"""CUDA graphs in the runtime (`RunConfig.cuda_graphs`): equal to eager, and how much faster.

1. Equivalence: small models over 2 GPUs in fp32 (GPT without dropout, ResNet-18 with
   BatchNorm), GPipe, 1F1B and interleaved at M=4, four steps each eager and graphed from
   the same initial weights and data: the largest relative difference of every parameter
   and gradient after the last step.
2. Speed: host-bound rows over 2 GPUs in bf16, eager and graphed in turn over three rounds,
   in one world per round and mode: step time (median of 10 after 3 warm-ups, the first of
   which captures), each rank's host time in its action loop and its peak memory.

    OUT=/tmp/graphs python3 benchmarks/cuda_graphs.py [--dry-run]   (dry: eager only, CPU)
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import dump, log, pack, two_gpu_rows

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.models.workload import Workload
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.worker import run_rank

DRY = False


def _tiny_gpt() -> Workload:
    return Workload(
        model="transformer", dataset="embeddings", seq_len=32, width=64, layers=6, heads=4
    )


def equivalence_configs() -> list[BenchConfig]:
    base = BenchConfig(
        suite="cuda-graphs",
        system="pipecast",
        workload=_tiny_gpt(),
        gpus=2,
        batch=8,
        microbatches=4,
        dtype="fp32",
        device="cpu" if DRY else "cuda",
        steps=3,
        warmup=1,
    )
    gpt_bounds = (0, 3, 6)  # 6 layers, one block each
    r18 = Workload(model="resnet18", dataset="cifar10")
    out = []
    for schedule in ("gpipe", "1f1b", "interleaved"):
        bounds = (0, 2, 3, 5, 6) if schedule == "interleaved" else gpt_bounds
        out.append(replace(base, schedule=schedule, boundaries=bounds))
    out.append(replace(base, workload=r18, schedule="1f1b", boundaries=(0, 5, 11)))
    return out


def _equal_rank(ctx: Context, cfg: BenchConfig, deterministic: bool) -> dict[str, Any]:
    if deterministic:  # cuDNN's default algorithms may add in any order
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    job = pipecast_job(cfg, capture=True)
    job = replace(job, exact_init=True)
    report = run_rank(ctx, job)
    return {
        "params": {k: v for k, v in report.params.items()},
        "grads": {k: v for k, v in report.grads.items()},
        "loss": [s.loss for s in report.steps],
    }


def _merge(ranks: list[dict[str, Any]], key: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for r in ranks:
        out.update(r[key])
    return out


def _overall(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """|a - b| over |a|, every tensor together (a tensor of near-zero values, such as a
    bias a few small updates from zero, can't inflate it as it does `_worst`)."""
    if set(a) != set(b):
        return float("inf")
    diff = torch.cat([(a[k] - b[k]).flatten().double() for k in a])
    return float(diff.norm() / torch.cat([a[k].flatten().double() for k in a]).norm())


def _worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if set(a) != set(b):
        return float("inf")
    worst = 0.0
    for k in a:
        scale = max(float(a[k].abs().max()), 1e-12)
        worst = max(worst, float((a[k] - b[k]).abs().max()) / scale)
    return worst


def equivalence(match: str, deterministic: bool) -> list[dict[str, Any]]:
    """Each configuration eager twice (how far eager runs differ from each other) and
    graphed once."""
    out = []
    backend = "gloo" if DRY else "nccl"
    for cfg in equivalence_configs():
        if match not in cfg.label():
            continue
        args = (cfg, deterministic)
        eager = spawn(_equal_rank, 2, args, backend=backend, timeout_s=200)
        again = spawn(_equal_rank, 2, args, backend=backend, timeout_s=200)
        graphed_cfg = cfg if DRY else replace(cfg, cuda_graphs=True)
        try:
            graphed = spawn(
                _equal_rank, 2, (graphed_cfg, deterministic), backend=backend, timeout_s=200
            )
        except Exception as exc:  # report and go on: the speed rows still say something
            log(f"equal {graphed_cfg.label()}: FAILED {str(exc)[:2000]}")
            out.append({"label": graphed_cfg.label(), "error": str(exc)[:4000]})
            continue
        row = {
            "label": graphed_cfg.label(),
            "params_worst_rel": _worst(_merge(eager, "params"), _merge(graphed, "params")),
            "grads_worst_rel": _worst(_merge(eager, "grads"), _merge(graphed, "grads")),
            "params_rel": _overall(_merge(eager, "params"), _merge(graphed, "params")),
            "grads_rel": _overall(_merge(eager, "grads"), _merge(graphed, "grads")),
            "eager_again_params_rel": _overall(_merge(eager, "params"), _merge(again, "params")),
            "eager_again_grads_rel": _overall(_merge(eager, "grads"), _merge(again, "grads")),
            "deterministic": deterministic,
            "params": len(_merge(eager, "params")),
            "loss_eager": [x for r in eager for x in r["loss"] if x is not None],
            "loss_graphed": [x for r in graphed for x in r["loss"] if x is not None],
        }
        log(
            f"equal {row['label']}: params {row['params_rel']:.2e} (eager twice "
            f"{row['eager_again_params_rel']:.2e}), grads {row['grads_rel']:.2e} (eager twice "
            f"{row['eager_again_grads_rel']:.2e}); worst tensor params "
            f"{row['params_worst_rel']:.2e}, grads "
            f"{row['grads_worst_rel']:.2e} over {row['params']} tensors; losses "
            f"{[round(x, 5) for x in row['loss_eager']]} / "
            f"{[round(x, 5) for x in row['loss_graphed']]}"
        )
        out.append(row)
    return out


def speed_configs() -> list[BenchConfig]:
    rows = two_gpu_rows("cuda-graphs", DRY)
    out = [replace(rows["vggc"], microbatches=m) for m in (1, 4, 16, 32)]
    return [*out, rows["r18"], rows["r50"], rows["gpt"]]


def _speed_rank(ctx: Context, configs: list[BenchConfig]) -> list[dict[str, Any]]:
    out = []
    for cfg in configs:
        report = run_rank(ctx, pipecast_job(cfg))
        times = sorted(s.seconds for s in report.steps)
        out.append(
            {
                "step_ms": times[len(times) // 2] * 1e3,
                "loop_ms": statistics.median(s.host_loop for s in report.steps) * 1e3,
                "peak_gib": max(s.peak_allocated for s in report.steps) / 2**30,
                "reserved_gib": max(s.peak_reserved for s in report.steps) / 2**30,
            }
        )
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def speed(rounds: int) -> list[dict[str, Any]]:
    configs = speed_configs()
    out = []
    for r in range(rounds):
        for graphed in (False, True) if r % 2 == 0 else (True, False):
            todo = [replace(c, cuda_graphs=graphed and not DRY) for c in configs]
            began = time.time()
            try:
                ranks = spawn(
                    _speed_rank, 2, (todo,), backend="gloo" if DRY else "nccl", timeout_s=300
                )
            except Exception as exc:
                log(f"round {r} graphed={graphed}: FAILED {str(exc)[:2000]}")
                out.append({"round": r, "graphed": graphed, "error": str(exc)[:4000]})
                continue
            for i, cfg in enumerate(todo):
                row = {
                    "round": r,
                    "graphed": graphed,
                    "label": cfg.label(),
                    "step_ms": max(rank[i]["step_ms"] for rank in ranks),
                    "loop_ms": [round(rank[i]["loop_ms"], 2) for rank in ranks],
                    "peak_gib": [round(rank[i]["peak_gib"], 3) for rank in ranks],
                    "reserved_gib": [round(rank[i]["reserved_gib"], 3) for rank in ranks],
                }
                log(
                    f"round {r} {'graphed' if graphed else 'eager  '} {cfg.label()}: "
                    f"{row['step_ms']:.2f} ms, host loop {row['loop_ms']} ms, peak "
                    f"{row['peak_gib']} GiB"
                )
                out.append(row)
            log(f"round {r} {'graphed' if graphed else 'eager'}: {time.time() - began:.1f} s")
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if "error" in row:
            continue
        label = row["label"].removesuffix(" graphs")
        by.setdefault(label, {}).setdefault("graphed" if row["graphed"] else "eager", []).append(
            row["step_ms"]
        )
    return {
        label: {mode: round(statistics.median(v), 2) for mode, v in modes.items()}
        | (
            {
                "speedup": round(
                    statistics.median(modes["eager"]) / statistics.median(modes["graphed"]), 2
                )
            }
            if "eager" in modes and "graphed" in modes
            else {}
        )
        for label, modes in by.items()
    }


def main() -> None:
    global DRY
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-equivalence", action="store_true")
    ap.add_argument("--equivalence-only", action="store_true")
    ap.add_argument("--match", default="", help="only equivalence configurations so labelled")
    ap.add_argument("--deterministic", action="store_true", help="cuDNN deterministic")
    args = ap.parse_args()
    DRY = args.dry_run
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if not DRY else "cpu",
    }
    if not args.skip_equivalence:
        result["equivalence"] = equivalence(args.match, args.deterministic)
        dump("cuda_graphs.json", result)
    if args.equivalence_only:
        return
    result["speed"] = speed(args.rounds)
    result["summary"] = summary(result["speed"])
    log(f"summary: {result['summary']}")
    dump("cuda_graphs.json", result)
    log("done")


if __name__ == "__main__":
    try:
        main()
    finally:
        pack()
