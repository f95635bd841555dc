"""Where a split backward's host time goes, and what the runtime's way of issuing it saves.

GPT ZB-H1 over 4 stages at M=16 (micro-batch 2) ran 1.5-1.6x slower than 1F1B on the 4 x
H100 and H200 runs 10 and 11 (319-402 ms against 211-249): on ranks 1-3 the runtime spent
6.0-9.3 ms of host time per B and per W, against 6.4-9.9 ms per whole backward. Each B makes one
autograd call per segment (a transformer layer) and each W one per node that feeds weights
(seven per layer), so W is mostly the fixed cost of an autograd call.

Part 1, one GPU, one stage of 6 layers (the suite's GPT, micro-batch 2, bf16): host ms per
micro-batch of the forward (whole and cut into segments), the whole backward, B, W and the
part of B spent finding the nodes that feed weights, by the road the autograd calls take:
'public' (torch.autograd's functions, as the runtime called them before), 'direct'
(straight into the engine), 'nested' (direct, and each W from inside one outer backward, on
the engine's worker thread: `backward.backward_weights`) and 'runtime' (nested, with the
weights of Linear, LayerNorm and bias nodes by the op itself, no autograd call:
`runtime/weight_grads.py`); and the host us of
one autograd call on a tiny graph by road. Every road's gradients are checked against the
whole backward's.

Part 2, with two GPUs: GPT over both (12 layers each), ZB-H1 and 1F1B at M=16, through the
runtime on the 'public' and the 'runtime' road, alternating, three rounds.

    cd benchmarks && OUT=/tmp/r python3 split_backward.py   (--dry-run: tiny GPT on CPU)

Writes split_backward.json (ms) and logs every reading.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import OUT, dump, log

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.bench.timing import action_stats
from pipecast.hardware import devices
from pipecast.models.workload import Workload
from pipecast.runtime import autograd_calls
from pipecast.runtime import backward as backward_module
from pipecast.runtime.backward import (
    backward_full,
    backward_input_segments,
    backward_weights,
)
from pipecast.runtime.config import RunConfig
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.stage import StageModule, materialize
from pipecast.runtime.worker import run_rank

DRY = "--dry-run" in sys.argv or not torch.cuda.is_available()
if DRY:
    WORKLOAD = Workload(
        model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
    )
    BOUNDS, DTYPE, DEVICE = (2, 5), "fp32", torch.device("cpu")
else:
    WORKLOAD = Workload(model="transformer", dataset="embeddings")
    BOUNDS, DTYPE, DEVICE = (6, 12), "bf16", torch.device("cuda", 0)
MICRO, M, REPEATS = 2, 16, 5


def _stage() -> StageModule:
    model = WORKLOAD.build("meta")
    blocks = materialize(model[BOUNDS[0] : BOUNDS[1]], DEVICE)
    return StageModule(1, blocks, DEVICE, RunConfig(dtype=DTYPE), first=False, last=False)


def _timed(fn: Callable[[], Any], into: list[float]) -> Any:
    began = time.perf_counter()
    out = fn()
    into.append(time.perf_counter() - began)
    return out


def _grads(st: StageModule) -> list[torch.Tensor]:
    out = [p.grad.detach().float().clone() for p in st.params if p.grad is not None]
    for p in st.params:
        p.grad = None
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        torch.allclose(x, y, rtol=2e-2, atol=1e-3) for x, y in zip(a, b, strict=True)
    )


def readings(st: StageModule, x: torch.Tensor) -> tuple[dict[str, float], dict[str, bool]]:
    """Host ms per micro-batch, by the road autograd calls take ('public': through
    torch.autograd's functions; 'direct': straight into the engine; 'runtime': direct, and
    each W from inside one outer backward, as the runtime issues them): M forwards, then M whole
    backwards; M cut forwards, M Bs, then M Ws (a schedule's warm-up and cool-down);
    and the share of B spent finding the nodes that feed weights. Medians of REPEATS
    after one warm-up."""
    kinds = ("F", "BW", "Fcut", "B", "W", "find")
    roads = ("public", "direct", "nested", "runtime")
    runs: dict[str, list[float]] = {f"{k}_{r}": [] for r in roads for k in kinds}
    same: dict[str, bool] = {}
    seed = torch.ones(MICRO, *WORKLOAD.spec.sample_shape, dtype=x.dtype, device=DEVICE)
    finding: list[float] = []
    find = backward_module._weight_nodes

    def timed_find(*args: Any) -> Any:
        return _timed(lambda: find(*args), finding)

    backward_module._weight_nodes = timed_find
    try:
        for repeat in range(REPEATS + 1):
            for road in roads:
                autograd_calls._DIRECT_ENGINE = road != "public"
                backward_module._DIRECT_WEIGHTS = road == "runtime"
                t = {k: [] for k in kinds}

                kept = []
                for _ in range(M):
                    leaf = x.detach().requires_grad_(True)
                    kept.append((leaf, _timed(lambda leaf=leaf: st.forward(leaf), t["F"])))
                for leaf, y in kept:
                    _timed(lambda y=y, leaf=leaf: backward_full(y, seed, leaf, st.params), t["BW"])
                del kept
                devices.synchronize(DEVICE)
                whole = _grads(st)
                kept_cut = []
                for _ in range(M):
                    leaf = x.detach().requires_grad_(True)
                    kept_cut.append(
                        (leaf, *_timed(lambda leaf=leaf: st.forward_cut(leaf), t["Fcut"]))
                    )
                works = []
                finding.clear()
                for leaf, y, cuts in kept_cut:
                    works.append(
                        _timed(
                            lambda y=y, leaf=leaf, cuts=cuts: backward_input_segments(
                                y, seed, leaf, cuts, st.part_params
                            )[1],
                            t["B"],
                        )
                    )
                t["find"] = [sum(finding) / M]
                del kept_cut
                for work in works:
                    _timed(
                        lambda work=work, road=road: backward_weights(
                            work, DEVICE, nest=road in ("nested", "runtime")
                        ),
                        t["W"],
                    )
                del works
                devices.synchronize(DEVICE)
                same[road] = same.get(road, True) and _same(whole, _grads(st))
                if repeat:
                    for k in kinds:
                        runs[f"{k}_{road}"].append(sum(t[k]) / len(t[k]))
    finally:
        backward_module._weight_nodes = find
        autograd_calls._DIRECT_ENGINE = autograd_calls._direct_engine_works()
        backward_module._DIRECT_WEIGHTS = True
    return {k: statistics.median(v) * 1e3 for k, v in runs.items()}, same


def call_cost(road: str, calls: int = 200) -> float:
    """Host us per autograd call on a two-node graph (a Linear of width 8, kept), by road."""
    layer = torch.nn.Linear(8, 8).to(DEVICE)
    x = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    y = layer(x)
    seed = torch.ones_like(y)

    def many() -> None:
        for _ in range(calls):
            if road == "public":
                torch.autograd.backward(y, seed, retain_graph=True, inputs=[layer.weight])
            else:
                autograd_calls.engine_call((y,), (seed,), (layer.weight,), accumulate=True)

    times = []
    for _ in range(REPEATS + 1):
        began = time.perf_counter()
        if road == "nested":  # from inside one outer backward, as the runtime's W
            autograd_calls.on_engine_thread(many, DEVICE)
        else:
            many()
        devices.synchronize(DEVICE)
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:]) / calls * 1e6


def _roads(road: str) -> None:
    """Set this process's autograd road: 'public' (before this change) or 'runtime'."""
    autograd_calls._DIRECT_ENGINE = road == "runtime" and autograd_calls._direct_engine_works()
    backward_module._NEST_WEIGHTS = road == "runtime"
    backward_module._DIRECT_WEIGHTS = road == "runtime"


def _row(ctx: Context, cfg: BenchConfig, road: str) -> dict[str, Any]:
    _roads(road)
    report = run_rank(ctx, pipecast_job(cfg))
    _roads("runtime")
    stats = action_stats(report.steps, report.events)
    # every rank runs M actions of each kind its schedule has
    kinds = ("F", "B", "W") if cfg.schedule == "zb-h1" else ("F", "BW")
    steps = sorted(s.seconds for s in report.steps)
    return {
        "step": steps[len(steps) // 2],  # as the bench takes a row's step
        "host_per_action": {k: stats[f"host_{k}"] / M for k in kinds},
    }


def runtime_rows() -> list[dict[str, Any]]:
    """GPT over two GPUs (12 layers each, micro-batch 2), ZB-H1 and 1F1B at M=16, through
    the runtime with the autograd road before this change ('public') and as it is now
    ('runtime'), alternating, three rounds: step ms and host ms per action per rank."""
    world, bounds = 2, ((0, 4, 8) if DRY else (0, 12, 24))
    out = []
    for round_ in range(3):
        for schedule in ("zb-h1", "1f1b"):
            for road in ("public", "runtime"):
                cfg = BenchConfig(
                    suite="split-backward",
                    system="pipecast",
                    workload=WORKLOAD,
                    gpus=world,
                    batch=MICRO * M,
                    schedule=schedule,
                    microbatches=M,
                    boundaries=bounds,
                    dtype=DTYPE,  # type: ignore[arg-type]
                    device=DEVICE.type,
                )
                ranks = spawn(
                    _row,
                    world,
                    (cfg, road),
                    backend="nccl" if DEVICE.type == "cuda" else "gloo",
                    timeout_s=300,
                )
                step = max(r["step"] for r in ranks) * 1e3
                host = [
                    {k: round(v * 1e3, 2) for k, v in r["host_per_action"].items()} for r in ranks
                ]
                log(f"round {round_} {schedule} {road}: step {step:.1f} ms, host per action {host}")
                out.append(
                    {
                        "round": round_,
                        "schedule": schedule,
                        "road": road,
                        "step_ms": step,
                        "host_ms_per_action": host,
                    }
                )
    return out


def main() -> None:
    torch.manual_seed(0)
    st = _stage()
    dtype = devices.DTYPES[DTYPE] if DTYPE != "fp32" else torch.float32
    x = torch.randn(MICRO, *WORKLOAD.spec.sample_shape, device=DEVICE, dtype=dtype)
    device_name = torch.cuda.get_device_name(0) if DEVICE.type == "cuda" else "cpu"
    log(f"{device_name}, torch {torch.__version__}, layers {BOUNDS}, micro-batch {MICRO}")
    result: dict[str, Any] = {"device": device_name, "torch": torch.__version__}
    for round_ in range(3):
        ms, same = readings(st, x)
        calls = {f"call_us_{road}": call_cost(road) for road in ("public", "direct", "nested")}
        log(
            f"round {round_}: "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items())
            + ", "
            + ", ".join(f"{k} {v:.1f}" for k, v in calls.items())
            + f"; gradients match {same}"
        )
        result.setdefault("rounds", []).append({**ms, **calls, "gradients_match": same})
    if DEVICE.type != "cuda" or torch.cuda.device_count() >= 2:
        result["runtime"] = runtime_rows()
    dump("split_backward.json", result)
    log(f"wrote {OUT / 'split_backward.json'}")


if __name__ == "__main__":
    main()
