"""Does a rank issue its stage's work slower beside busy ranks, or only inside the runtime?
On the 4 x H100 runs the runtime's host seconds per action on a host-bound pipeline were
1.0-1.6x (median per run) what the profile priced, and the probe's host factor (a tiny model
issued by every rank at once) did not follow it: GPT ZB-H1 over 4 stages at M=16 was
predicted 31-34% fast on runs 7, 8 and 11 with factors of 0.9-1.2.

This times, for each rank's stage of GPT (24 layers, micro-batch 2, bf16, split evenly over
up to four GPUs: the suite's 0, 6, 12, 18, 24 on four), the host seconds per micro-batch
of the runtime's own calls (a forward, the whole backward, or B over the stage's segments and
then W), outside the runtime:

* `alone`: one rank at a time, the others waiting in a gloo barrier;
* `together`: every rank at once;

three rounds of each (medians kept), with three readings of the host's speed in each setting
(`hostspeed.issue`, the same with a tiny transformer in place of its model, and
`hostspeed.reference`); then the runtime itself on the same world (ZB-H1 and 1F1B, M=16:
host seconds per action from its action loop). Before that the driver takes one profile at
micro-batch 2 and one probe, and predicts the runtime's two rows from them.

    cd benchmarks && OUT=/tmp/r python3 busy_host.py     (--dry-run, or without two GPUs:
                                                         tiny GPT, 2 gloo ranks on CPU)

Writes busy_host.json (every reading, ms) and prints one table.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
import torch.distributed as dist
from common import OUT
from gpu_run import probe_options, profile

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.bench.timing import action_stats
from pipecast.hardware import devices, hostspeed
from pipecast.hardware.probe import probe
from pipecast.models.workload import Workload
from pipecast.profile.types import Profile
from pipecast.recommend.predict import predict
from pipecast.recommend.strategy import Strategy
from pipecast.runtime.backward import backward_full, backward_input_segments, backward_weight
from pipecast.runtime.config import RunConfig
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.stage import StageModule, materialize
from pipecast.runtime.worker import run_rank

# --dry-run (or no two GPUs): the same flow, tiny, on CPU ranks; the spawned ranks, which
# import this module afresh, learn it from the environment
DRY = "--dry-run" in sys.argv or os.environ.get("PIPECAST_BUSY_HOST_DRY") == "1"
if DRY:
    os.environ["PIPECAST_BUSY_HOST_DRY"] = "1"
CUDA = not DRY and torch.cuda.is_available() and torch.cuda.device_count() >= 2
if CUDA:
    WORKLOAD = Workload(model="transformer", dataset="embeddings")
    WORLD = min(4, torch.cuda.device_count())
    # 24 layers split evenly: the suite's 0, 6, 12, 18, 24 over four GPUs
    BOUNDS = tuple(24 * r // WORLD for r in range(WORLD + 1))
    MICRO, M, DTYPE = 2, 16, "bf16"
else:
    WORKLOAD = Workload(
        model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
    )
    WORLD, BOUNDS, MICRO, M, DTYPE = 2, (0, 4, 8), 2, 4, "fp32"
REPEATS, ROUNDS = 2, 3
SCHEDULES = ("zb-h1", "1f1b")


def _stage(ctx: Context) -> StageModule:
    model = WORKLOAD.build("meta")
    blocks = materialize(model[BOUNDS[ctx.rank] : BOUNDS[ctx.rank + 1]], ctx.device)
    return StageModule(
        ctx.rank,
        blocks,
        ctx.device,
        RunConfig(dtype=DTYPE),
        first=ctx.rank == 0,
        last=ctx.rank == WORLD - 1,
    )


def _input(ctx: Context, st: StageModule) -> torch.Tensor:
    sample = WORKLOAD.spec.sample_shape
    dtype = devices.DTYPES[DTYPE]
    return torch.randn(MICRO, *sample, dtype=dtype, device=ctx.device)


def _timed(fn: Callable[[], Any], into: list[float]) -> Any:
    began = time.perf_counter()
    out = fn()
    into.append(time.perf_counter() - began)
    return out


def stage_loop(ctx: Context, st: StageModule, x: torch.Tensor) -> dict[str, float]:
    """Host ms per micro-batch of F, BW (whole backward) and F, B, W (split, cut into
    segments as the runtime cuts them): M forwards, then M backwards, then M Ws; the median
    of REPEATS after one warm-up."""
    out: dict[str, list[float]] = {k: [] for k in ("F", "BW", "Fcut", "B", "W")}
    first = ctx.rank == 0
    for repeat in range(REPEATS + 1):
        t: dict[str, list[float]] = {k: [] for k in out}
        # whole backward (GPipe, 1F1B)
        kept = []
        for _ in range(M):
            leaf = None if first else x.detach().requires_grad_(True)
            y = _timed(lambda leaf=leaf: st.forward(x if leaf is None else leaf), t["F"])
            kept.append((leaf, y))
        for leaf, y in kept:
            seed = torch.ones_like(y)
            _timed(lambda y=y, s=seed, leaf=leaf: backward_full(y, s, leaf, st.params), t["BW"])
        del kept
        devices.synchronize(ctx.device)
        # split backward (ZB): the first stage's B is its whole backward
        kept = []
        for _ in range(M):
            if first:
                y = _timed(lambda: st.forward(x), t["Fcut"])
                kept.append((None, y, []))
            else:
                leaf = x.detach().requires_grad_(True)
                y, cuts = _timed(lambda leaf=leaf: st.forward_cut(leaf), t["Fcut"])
                kept.append((leaf, y, cuts))
        works = []
        for leaf, y, cuts in kept:
            seed = torch.ones_like(y)
            if first:
                _timed(lambda y=y, seed=seed: backward_full(y, seed, None, st.params), t["B"])
            else:
                _, w = _timed(
                    lambda y=y, seed=seed, leaf=leaf, cuts=cuts: backward_input_segments(
                        y, seed, leaf, cuts, st.part_params
                    ),
                    t["B"],
                )
                works.append(w)
        del kept
        for w in works:
            _timed(lambda w=w: [backward_weight(part) for part in w], t["W"])
        del works
        devices.synchronize(ctx.device)
        for p in st.params:
            p.grad = None
        if repeat:
            for k in out:
                if t[k]:
                    out[k].append(sum(t[k]) / len(t[k]))
    return {k: statistics.median(v) * 1e3 for k, v in out.items() if v}


def _issue_ms(device: torch.device) -> float:
    return hostspeed.issue(device) * 1e3


_LAYERS: dict[str, tuple[torch.nn.Module, torch.Tensor]] = {}


def _layers_ms(device: torch.device) -> float:
    """hostspeed.issue's reading with a tiny transformer (4 encoder layers, width 64,
    batch 2 x 16 tokens) in place of its 16 Linear+ReLU layers: the same kind of host work
    as a GPT stage's, at a size whose device time is negligible."""
    key = str(device)
    if key not in _LAYERS:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        model = torch.nn.Sequential(*(copy.deepcopy(layer) for _ in range(4))).to(device)
        _LAYERS[key] = (model, torch.randn(2, 16, 64, device=device))
    model, x = _LAYERS[key]
    return hostspeed.step_seconds(model, x, device, repeats=5, warmup=1, zero_grad=True) * 1e3


def _readings(ctx: Context, st: StageModule, x: torch.Tensor) -> dict[str, float]:
    out = stage_loop(ctx, st, x)
    out["issue"] = _issue_ms(ctx.device)
    out["issue_layers"] = _layers_ms(ctx.device)
    out["reference"] = hostspeed.reference(repeats=3) * 1e3
    return out


def _medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def on_rank(ctx: Context) -> dict[str, Any]:
    coord = dist.new_group(backend="gloo")
    st = _stage(ctx)
    x = _input(ctx, st)
    result: dict[str, Any] = {"rank": ctx.rank, "alone_rounds": [], "together_rounds": []}
    with devices.pinned(ctx.device):
        _readings(ctx, st, x)  # everyone warm
        for _ in range(ROUNDS):  # each round: every rank alone in turn, then all at once
            for turn in range(ctx.world):
                dist.barrier(group=coord)
                if turn == ctx.rank:
                    result["alone_rounds"].append(_readings(ctx, st, x))
            dist.barrier(group=coord)
            result["together_rounds"].append(_readings(ctx, st, x))
            dist.barrier(group=coord)
    result["alone"] = _medians(result["alone_rounds"])
    result["together"] = _medians(result["together_rounds"])
    del st, x
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    for schedule in SCHEDULES:
        cfg = BenchConfig(
            suite="busy",
            system="pipecast",
            workload=WORKLOAD,
            gpus=WORLD,
            batch=MICRO * M,
            microbatches=M,
            boundaries=BOUNDS,
            schedule=schedule,
            steps=5,
            warmup=2,
            device=ctx.device.type,
            dtype=DTYPE,
        )
        report = run_rank(ctx, pipecast_job(cfg))
        stats = action_stats(report.steps, report.events)
        # every rank runs M actions of each kind its schedule has (the clock counts them
        # on GPU only)
        kinds = ("F", "B", "W") if schedule == "zb-h1" else ("F", "BW")
        row = {k: stats[f"host_{k}"] / M * 1e3 for k in kinds}
        row["step"] = statistics.median(s.seconds for s in report.steps) * 1e3
        row["loop"] = stats["loop"] * 1e3
        row["issue"] = _issue_ms(ctx.device)
        result[f"runtime_{schedule}"] = row
    return result


def profiled() -> tuple[Profile, dict[str, Any]]:
    """The profile at MICRO, and its host price of each rank's stage (ms), in this driver."""
    # gpu_run.py's profile: saved as OUT/profile_gpt.json, the device's cache emptied
    prof = profile("gpt", WORKLOAD, (MICRO,), device="cuda" if CUDA else "cpu", dtype=DTYPE)
    out: dict[str, Any] = {"issue": prof.host_issue * 1e3, "stages": []}
    for r in range(WORLD):
        c = prof.stage(BOUNDS[r], BOUNDS[r + 1], MICRO)
        # on a CPU the host does the work: its times are the profile's device times
        f, bw, b, w = (
            (c.host_forward, c.host_backward, c.host_backward_input, c.host_backward_weight)
            if CUDA
            else (c.forward, c.backward, c.backward_input, c.backward_weight)
        )
        out["stages"].append(
            {"F": f * 1e3, "BW": bw * 1e3, "B": (bw if r == 0 else b) * 1e3, "W": w * 1e3}
        )
    return prof, out


def predicted(prof: Profile) -> dict[str, Any]:
    """The probe on this world, and what the predictor makes of the runtime's two rows
    from it and the profile (ms per step)."""
    result = probe(probe_options(WORLD, dry=not CUDA))  # gpu_run.py's probe
    cluster = result.cluster
    out: dict[str, Any] = {
        "host_issue": {str(n): v * 1e3 for n, v in cluster.host_issue.items()},
        "host_factor": cluster.host_factor(WORLD, prof.host_issue),
        "host_overhead": cluster.host_overhead * 1e3,
    }
    for schedule in SCHEDULES:
        strategy = Strategy(
            kind="pipeline",
            stages=WORLD,
            schedule=schedule,
            microbatches=M,
            partition=",".join(map(str, BOUNDS)),
        )
        pred = predict(prof, cluster, strategy, MICRO * M, memory_margin=0.0, runtime=True)
        out[schedule] = pred.step_time * 1e3
    return out


def main() -> None:
    began = time.time()
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "gpu": devices.name(torch.device("cuda", 0) if CUDA else torch.device("cpu")),
        "micro_batch": MICRO,
        "microbatches": M,
        "bounds": BOUNDS,
    }
    prof, result["profile"] = profiled()
    print(f"profiled in {time.time() - began:.0f} s", flush=True)
    result["predicted"] = predicted(prof)
    (OUT / "busy_host.json").write_text(json.dumps(result, indent=1))
    print(f"probed and predicted in {time.time() - began:.0f} s", flush=True)
    result["ranks"] = spawn(on_rank, WORLD, backend="nccl" if CUDA else "gloo", timeout_s=300)
    (OUT / "busy_host.json").write_text(json.dumps(result, indent=1))
    print(f"done in {time.time() - began:.0f} s", flush=True)
    print(table(result))


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['gpu']}, torch {result['torch']}: host ms per micro-batch, GPT stages at "
        f"micro-batch {result['micro_batch']}, M={result['microbatches']}",
        "rank kind   profile   alone  together  runtime(zb-h1)  runtime(1f1b)",
    ]
    nan = float("nan")
    for r, rank in enumerate(result["ranks"]):
        prof = result["profile"]["stages"][r]
        # (label, profile's key, key outside the runtime, ZB-H1's key, 1F1B's key)
        for label, pk, ok, zk, ok1 in (
            ("F", "F", "F", "", "F"),
            ("Fcut", "F", "Fcut", "F", ""),
            ("BW", "BW", "BW", "", "BW"),
            ("B", "B", "B", "B", ""),
            ("W", "W", "W", "W", ""),
        ):
            if r == 0 and label == "W":
                continue
            zb = rank["runtime_zb-h1"].get(zk, nan)
            one = rank["runtime_1f1b"].get(ok1, nan)
            lines.append(
                f"{r:4d} {label:5s} {prof[pk]:8.2f} {rank['alone'].get(ok, nan):7.2f} "
                f"{rank['together'].get(ok, nan):9.2f} {zb:15.2f} {one:14.2f}"
            )
    issue = " ".join(
        f"rank {r['rank']}: alone {r['alone']['issue']:.2f}, "
        f"together {r['together']['issue']:.2f}, in runtime {r['runtime_zb-h1']['issue']:.2f}"
        for r in result["ranks"]
    )
    lines.append(f"hostspeed.issue ms: profile {result['profile']['issue']:.2f}; {issue}")
    lines.append("together / alone, per rank (medians over rounds):")
    for rank in result["ranks"]:
        a, t = rank["alone"], rank["together"]
        work = statistics.median(t[k] / a[k] for k in ("F", "Fcut", "BW", "B", "W") if k in a)
        proxies = ", ".join(
            f"{k} {t[k] / a[k]:.2f}" for k in ("issue", "issue_layers", "reference")
        )
        lines.append(f"  rank {rank['rank']}: stage work {work:.2f}; {proxies}")
    pred = result["predicted"]
    lines.append(
        f"probe: host factor {pred['host_factor']:.2f} (issue ms by busy ranks "
        f"{ {n: round(v, 2) for n, v in pred['host_issue'].items()} }), runtime cost "
        f"{pred['host_overhead']:.2f} ms per action"
    )
    for s in SCHEDULES:
        measured = result["ranks"][0]["runtime_" + s]["step"]
        lines.append(
            f"{s}: predicted {pred[s]:.1f} ms, measured {measured:.1f} ms "
            f"({pred[s] / measured - 1:+.1%})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
