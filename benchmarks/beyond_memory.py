"""Training past the GPU's memory on one GPU: pipecast's pick at each limit beside torch's
own ways, in one device call.

    python -m benchmarks.beyond_memory --out DIR [--limits 2,3,4,8,16] [--budget 540]
    python -m benchmarks.beyond_memory --load gpt6b --limits 0 --torch-modes fsdp-offload-ckpt

(a limit of 0: the GPU's own memory.)

torch's side: `anchors/one_gpu.py`'s FSDP2 CPU offload (with and without checkpointing) and
save_on_cpu, and a plain step with every block checkpointed (this file, `--torch ckpt`), each
a process of its own, run without a limit: its peak reserved memory says at which limits it
fits. pipecast's side, as a user runs it: one profile of the model (`pipecast profile
--measure-layers 2`, tiled), then for each limit `pipecast recommend --memory-limit L` and
`pipecast train --recommendation` of its pick. DIR/runs.jsonl has a row a run, the table
comes last; a run past the budget is skipped, so the call always returns its table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.one_gpu import ANCHOR, LOADS, Load

MODEL = ["--model", "gpt", "--dataset", "tokens"]
TORCH_MODES = ("fsdp-offload", "fsdp-offload-ckpt", "save-on-cpu", "ckpt")


def _shape(load: Load) -> list[str]:
    return [*MODEL, "--width", str(load.width), "--layers", str(load.layers),
            "--heads", str(load.heads), "--seq-len", str(load.seq)]  # fmt: skip


def _sizes(batch: int) -> str:
    """Micro-batch sizes to profile: powers of two up to the batch."""
    return ",".join(str(2**k) for k in range(batch.bit_length()) if 2**k <= batch)


def torch_checkpointed(load: Load) -> dict[str, Any]:
    """torch's plain step with every block checkpointed (the anchor's loop otherwise)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from pipecast.values.models.workload import Workload

    torch.manual_seed(0)
    dev = torch.device("cuda")
    wl = Workload(
        model=load.model, dataset=load.dataset, width=load.width, layers=load.layers,
        heads=load.heads, seq_len=load.seq,
    )  # fmt: skip
    model = wl.build().to(torch.bfloat16)
    for i, b in enumerate(list(model.children())):
        if b.__class__.__name__ == "Block":
            model[i] = checkpoint_wrapper(b)
    model = model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, wl.vocab, (load.batch, load.seq), device=dev)
    y = torch.randint(0, wl.vocab, (load.batch, load.seq), device=dev)
    times = []
    for step in range(11):
        if step == 3:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        began = time.perf_counter()
        out = model(x)
        F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= 3:
            times.append(time.perf_counter() - began)
    return {
        "mode": "ckpt",
        "step_ms": round(statistics.median(times) * 1e3, 2),
        "peak_alloc_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
    }


def _run(
    cmd: list[str], timeout: float, log: Path, env: dict[str, str] | None = None
) -> tuple[str, bool]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "timeout", False
    log.write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
    return p.stdout, p.returncode == 0


def _train(
    args: argparse.Namespace, rec: Path, out: Path, limit: str, threads: str, left: float
) -> dict[str, Any]:
    """`pipecast train` of the recommendation `rec`, its host step on `threads` threads
    ('': pipecast's default), as a row."""
    t0 = time.monotonic()
    name = f"train_{limit}" + (f"_t{threads}" if threads else "")
    run_dir = out / name
    env = dict(os.environ, **({"PIPECAST_HOST_THREADS": threads} if threads else {}))
    text, ran = _run(
        [sys.executable, "-m", "pipecast", "train", "--recommendation", str(rec),
         "--steps", str(args.steps), "--warmup-steps", "2", "--out-dir", str(run_dir),
         *(["--kernel-trace"] if args.kernel_trace else [])],
        left, out / f"{name}.log", env=env,
    )  # fmt: skip
    row: dict[str, Any] = {"side": "pipecast", "limit": float(limit)}
    if threads:
        row["host_threads"] = int(threads)
    summaries = sorted(run_dir.glob("*.summary.json")) if ran else []
    if not summaries:
        return {**row, "failed": text[-400:]}
    s = json.loads(summaries[0].read_text())
    kernels = sorted(run_dir.glob("*.kernels.json"))
    return {
        **row, "strategy": s.get("strategy"),
        "step_ms": round(s["step_time"] * 1e3, 2),
        "predicted_ms": round(s.get("predicted_step_time", 0.0) * 1e3, 2),
        "peak_alloc_gib": round(max(s["peak_allocated"]) / 2**30, 3),
        "peak_reserved_gib": round(max(s["peak_reserved"]) / 2**30, 3),
        # the host's Adam as the run stepped it, to set beside the probe's isolated reading
        "host_optimizer_gbps": round(max(s.get("host_optimizer_rate") or [0.0]) / 1e9, 2),
        "process_s": round(time.monotonic() - t0),
        **({"kernels": json.loads(kernels[0].read_text())} if kernels else {}),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="beyond-memory-out")
    ap.add_argument("--load", default="gpt2048")
    ap.add_argument("--limits", default="2,3,4,8,16")
    ap.add_argument("--torch-modes", default=",".join(TORCH_MODES))
    ap.add_argument("--budget", type=float, default=540.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--torch", default="", help="(internal) run one torch mode here")
    ap.add_argument(
        "--host-threads", default="", help="train each pick once per count (PIPECAST_HOST_THREADS)"
    )
    ap.add_argument("--kernel-trace", action="store_true", help="train --kernel-trace")
    args = ap.parse_args()
    load = LOADS[args.load]
    if args.torch == "ckpt":
        print(json.dumps(torch_checkpointed(load)), flush=True)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    rows: list[dict[str, Any]] = []

    def left() -> float:
        return args.budget - (time.monotonic() - began)

    def keep(row: dict[str, Any]) -> None:
        rows.append(row)
        with (out / "runs.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    for mode in filter(None, args.torch_modes.split(",")):
        if left() < 30:
            break
        cmd = (
            [sys.executable, "-m", "benchmarks.beyond_memory", "--load", args.load, "--torch", mode]
            if mode == "ckpt"
            else [sys.executable, str(ANCHOR), "--mode", mode, *load.anchor_args()]
        )
        t0 = time.monotonic()
        text, ok = _run(cmd, left(), out / f"torch_{mode}.log")
        line = next((x for x in text.splitlines() if x.startswith("{")), "")
        row = json.loads(line) if ok and line else {"failed": text[-300:]}
        keep({"side": "torch", "mode": mode, "process_s": round(time.monotonic() - t0), **row})
    profile = out / "profile.json"
    shape = _shape(load)
    t0 = time.monotonic()
    ok = profile.exists()  # an earlier run's into the same --out: the same model's
    _, ok = ("", True) if ok else _run(
        [sys.executable, "-m", "pipecast", "profile", *shape, "--dtype", "bf16", "--device",
         "cuda", "--micro-batch-sizes", _sizes(load.batch), "--measure-layers", "2",
         "-o", str(profile)],
        left(), out / "profile.log",
    )  # fmt: skip
    print(f"profile: {ok} ({time.monotonic() - t0:.0f} s)", flush=True)
    for limit in args.limits.split(","):
        if not ok or left() < 40:
            break
        rec = out / f"rec_{limit}"
        common = [*shape, "--batch", str(load.batch), "--gpus", "1", "--optimizer", load.optim]
        text, fits = _run(
            [sys.executable, "-m", "pipecast", "recommend", *common, "--profile", str(profile),
             *(["--memory-limit", limit] if float(limit) else []), "--top", "4", "-o", str(rec)],
            left(), out / f"rec_{limit}.log",
        )  # fmt: skip
        if not fits:
            keep({"side": "pipecast", "limit": float(limit), "failed": text[-400:]})
            continue
        for threads in args.host_threads.split(",") if args.host_threads else [""]:
            if left() < 30:
                break
            keep(_train(args, rec, out, limit, threads, left()))
    for r in rows:
        print(r.get("mode") or r.get("limit"), r.get("step_ms"), r.get("peak_reserved_gib"),
              r.get("strategy", ""), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
