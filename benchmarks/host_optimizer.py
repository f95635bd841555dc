"""What the optimizer on the host costs a step, term by term, against what the planner prices.

    python -m benchmarks.host_optimizer --out DIR [--layers 8] [--width 2048]

One rank (spawned as the runtime spawns its ranks, so with the runtime's threads and CPU
binding) holds a transformer's blocks with RunConfig(offload="optimizer", optimizer="adam")
in each dtype, gives every weight a gradient and times the pieces of StageModule.step(): the
gradients copied out to pinned host buffers, Adam's step over the host's copy, the weights
copied back. In the same rank it runs the probe's own readings (host_link.optimizer_rate
and the host link's copies), and prices the step as planning/simulation/pricing._offloaded
does: 2 x the link's time for the weights' bytes + the bytes / the optimizer rate. The
table says which term the price gets wrong, and by how much.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipecast.measuring.probe import host_link
from pipecast.runtime import devices
from pipecast.runtime.config import RunConfig
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.stage import StageModule, materialize
from pipecast.values.hardware.fit import fit_link
from pipecast.values.models.workload import Workload


def _median(ctx: Context, fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        devices.synchronize(ctx.device)
        began = time.perf_counter()
        fn()
        devices.synchronize(ctx.device)
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:])


def _terms(ctx: Context, workload: Workload, dtype: str, repeats: int) -> dict[str, Any]:
    config = RunConfig(offload="optimizer", optimizer="adam", dtype=dtype)  # type: ignore[arg-type]
    blocks = materialize(workload.build("meta"), ctx.device)
    stage = StageModule(0, blocks, ctx.device, config, first=True, last=True)
    for p in stage.params:
        p.grad = torch.full_like(p, 1e-3)
    stage.step()  # Adam's state and the pinned gradient buffers, allocated once
    assert stage.host_params is not None and stage.host_grads is not None
    assert stage.optimizer is not None
    pairs = list(zip(stage.params, stage.host_params, stage.host_grads, strict=True))

    def out() -> None:
        for p, _, g in pairs:
            assert p.grad is not None
            g.copy_(p.grad, non_blocking=True)

    def back() -> None:
        with torch.no_grad():
            for p, h, _ in pairs:
                p.copy_(h, non_blocking=True)

    nbytes = sum(p.numel() * p.element_size() for p in stage.params)
    return {
        "dtype": dtype,
        "tensors": len(pairs),
        "param_bytes": nbytes,
        "copy_out": _median(ctx, out, repeats),
        "host_step": _median(ctx, stage.optimizer.step, repeats),
        "copy_back": _median(ctx, back, repeats),
        "whole": _median(ctx, stage.step, repeats),
    }


def _rank(ctx: Context, workload: Workload, dtypes: list[str], repeats: int) -> dict[str, Any]:
    rates = {
        "fp32": host_link.optimizer_rate(),
        "bf16": host_link.optimizer_rate(dtype=torch.bfloat16),
    }
    copies = host_link.samples(ctx)
    links = {k: fit_link([s for s, _ in v], [t for _, t in v]) for k, v in copies.items()}
    rows = []
    for dtype in dtypes:
        row = _terms(ctx, workload, dtype, repeats)
        moved = max(link.time(row["param_bytes"]) for link in links.values())
        row["priced_copy"] = moved
        row["priced_step"] = row["param_bytes"] / rates[dtype]
        row["priced_whole"] = 2 * moved + row["priced_step"]
        rows.append(row)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "threads": torch.get_num_threads(),
        "optimizer_rate": rates,
        "link_bandwidth": {k: link.bandwidth for k, link in links.items()},
        "rows": rows,
    }


def _table(result: dict[str, Any]) -> str:
    ms = 1e3
    lines = [
        f"threads {result['threads']}; probe: Adam (fused) "
        + ", ".join(f"{k} {r / 1e9:.2f} GB/s" for k, r in result["optimizer_rate"].items())
        + "; host link "
        + ", ".join(f"{k} {b / 1e9:.1f} GB/s" for k, b in result["link_bandwidth"].items()),
        "",
        "| dtype | tensors | weights | copy out | Adam on host | copy back | step | "
        "priced copy (each way) | priced Adam | priced step | step error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        error = r["priced_whole"] / r["whole"] - 1
        lines.append(
            f"| {r['dtype']} | {r['tensors']} | {r['param_bytes'] / 2**30:.2f} GiB | "
            f"{r['copy_out'] * ms:.1f} ms | {r['host_step'] * ms:.1f} ms | "
            f"{r['copy_back'] * ms:.1f} ms | {r['whole'] * ms:.1f} ms | "
            f"{r['priced_copy'] * ms:.1f} ms | {r['priced_step'] * ms:.1f} ms | "
            f"{r['priced_whole'] * ms:.1f} ms | {error:+.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    workload = Workload(
        model="transformer",
        dataset="embeddings",
        seq_len=1024,
        width=args.width,
        layers=args.layers,
        heads=16,
    )
    backend = "nccl" if args.device == "cuda" else "gloo"
    (result,) = spawn(
        _rank,
        1,
        (workload, args.dtypes.split(","), args.repeats),
        backend=backend,
        timeout_s=600,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_optimizer.json").write_text(json.dumps(result, indent=1))
    table = _table(result)
    (out / "host_optimizer.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
