"""One GPU: pipecast's one-device plans beside torch's own ways, in one device call.

    python -m benchmarks.one_gpu --set first --out DIR [--budget 540]

Every run is a process of its own (compiled code and the allocator start fresh), one after
another on the one GPU: torch's side is `anchors/one_gpu.py` (eager, compiled per block,
compiled whole; copied from the project's shared anchors, run from the repository's root),
pipecast's is the same zoo module trained by `run_job` on one rank, one micro-batch. Each
prints one JSON line; DIR/runs.jsonl keeps them and the table comes last. A run past the
budget is skipped, so a call always returns its table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANCHOR = Path(".anchors/one_gpu.py")


@dataclass(frozen=True)
class Load:
    model: str
    dataset: str
    batch: int
    optim: str
    width: int = 0
    layers: int = 0
    heads: int = 0
    seq: int = 0

    def anchor_args(self) -> list[str]:
        out = ["--model", self.model, "--dataset", self.dataset, "--batch", str(self.batch)]
        out += ["--optim", self.optim]
        for flag, value in (("--width", self.width), ("--layers", self.layers),
                            ("--heads", self.heads), ("--seq", self.seq)):  # fmt: skip
            if value:
                out += [flag, str(value)]
        return out


LOADS = {
    "gpt2048": Load("gpt", "tokens", 8, "adam", 2048, 24, 16, 1024),
    "gpt768": Load("gpt", "tokens", 8, "adam", 768, 12, 12, 1024),
    "resnet50": Load("resnet50", "imagenet", 256, "sgd"),
    "vgg16": Load("vgg16", "imagenet", 128, "sgd"),
    "gpt1024": Load("gpt", "tokens", 4, "adam", 1024, 16, 16, 2048),
    "gpt4096": Load("gpt", "tokens", 8, "adam", 4096, 8, 32, 2048),
    "gpt6b": Load("gpt", "tokens", 4, "adam", 4096, 32, 32, 2048),  # 6.5 B parameters
    "tiny": Load("gpt", "tokens", 2, "adam", 64, 2, 2, 64),  # dry runs on a CPU
}


@dataclass(frozen=True)
class Variant:
    """A pipecast run: compile mode, graphs, channels-last, micro-batches."""

    compile: str = "off"
    graphs: bool = True
    channels_last: bool = False
    microbatches: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        parts = [f"compile={self.compile}", "graphs" if self.graphs else "eager"]
        if self.channels_last:
            parts.append("channels-last")
        if self.microbatches > 1:
            parts.append(f"M={self.microbatches}")
        parts += [k if v is True else f"{k}={v}" for k, v in self.extra.items()]
        return " ".join(parts)


SETS: dict[str, list[tuple[str, list[str], list[Variant]]]] = {
    "first": [
        ("gpt768", ["eager", "compile", "compile-whole"], [
            Variant("off", True), Variant("blocks", True), Variant("stage", True),
            Variant("blocks", False),
        ]),
        ("resnet50", ["eager", "compile"], [
            Variant("blocks", True), Variant("blocks", True, True), Variant("off", True, True),
        ]),
    ],
    "second": [
        ("gpt768", ["compile-whole"], [Variant("blocks", True), Variant("stage", True)]),
        ("resnet50", ["eager", "compile"], [
            Variant("blocks", False, True), Variant("stage", True, True),
            Variant("stage", False, True),
        ]),
        ("gpt2048", ["eager", "compile"], [Variant("blocks", False), Variant("blocks", True)]),
    ],
    "third": [
        ("resnet50", ["eager", "compile"], [
            Variant("blocks", False, True), Variant("stage", True, True),
            Variant("stage", False, True),
        ]),
        ("vgg16", ["eager", "compile"], [
            Variant("blocks", True, True), Variant("blocks", False, True),
        ]),
    ],
    "fourth": [
        ("gpt4096", [], [
            Variant("blocks", False), Variant("blocks", False, extra={"float8": True}),
        ]),
        ("gpt1024", ["eager", "compile", "compile-whole"], [
            Variant("blocks", True), Variant("blocks", False),
        ]),
        ("gpt768", ["compile-whole"], [Variant("blocks", True)]),
        ("resnet50", ["eager"], [
            Variant("blocks", False, True, extra={"compile_budget": 0.9}),
            Variant("blocks", False, True, extra={"compile_budget": 0.6}),
        ]),
    ],
    "dry": [("tiny", [], [Variant("off", False)])],  # the plumbing, on a CPU
    "trace": [
        ("gpt768", ["compile-whole"], [Variant("blocks", True)]),
        ("gpt2048", ["compile"], [Variant("blocks", False)]),
    ],
    "large": [
        ("gpt2048", ["eager", "compile"], [
            Variant("blocks", False), Variant("blocks", True), Variant("off", False),
        ]),
        ("vgg16", ["eager", "compile"], [Variant("blocks", True, True)]),
        ("gpt1024", ["eager", "compile", "compile-whole"], [Variant("blocks", True)]),
    ],
}  # fmt: skip


def _pipecast(load: Load, variant: Variant) -> dict[str, Any]:
    """One pipecast run in this process: median of 8 steps after 3 warm-ups."""
    from pipecast.api import make_job
    from pipecast.runtime.config import RunConfig
    from pipecast.runtime.run import run_job
    from pipecast.values.models.workload import Workload

    workload = Workload(
        model=load.model, dataset=load.dataset, width=load.width or 512,
        layers=load.layers, heads=load.heads, seq_len=load.seq or 256,
    )  # fmt: skip
    blocks = workload.block_count()
    cpu = os.environ.get("ONE_GPU_DEVICE") == "cpu"  # a dry run of the plumbing
    config = RunConfig(
        dtype="fp32" if cpu else "bf16", optimizer=load.optim, lr=1e-4, compile=variant.compile,  # type: ignore[arg-type]
        cuda_graphs=variant.graphs, channels_last=variant.channels_last, **variant.extra,
    )  # fmt: skip
    job, _ = make_job(
        workload, gpus=1, microbatches=variant.microbatches, batch=load.batch,
        partition=f"0,{blocks}", steps=8, warmup_steps=3, config=config,
        device=os.environ.get("ONE_GPU_DEVICE", "cuda"),
    )  # fmt: skip
    trace = os.environ.get("ONE_GPU_TRACE")
    if trace:  # the step before the last, traced (benchmarks.kernel_mix)
        from benchmarks.kernel_mix import StepTracer

        job = dataclasses.replace(job, before_step=StepTracer(trace, job.total_steps - 2))
    began = time.perf_counter()
    result = run_job(job)
    assert result is not None
    s = result.summary
    kinds: dict[str, float] = {}
    for e in result.reports[0].events:  # the last step's actions, as the trace has them
        kinds[e.kind] = kinds.get(e.kind, 0.0) + (e.end - e.start) * 1e3
    steps = result.reports[0].steps
    host = {
        part: round(1e3 * sum(getattr(r, part) for r in steps) / max(len(steps), 1), 3)
        for part in ("host_before", "host_loop", "host_after")
    }
    return {
        "host_ms": host,
        "actions_ms": {k: round(v, 2) for k, v in kinds.items()},
        "step_ms": round(s["step_time"] * 1e3, 2),
        "peak_alloc_gib": round(s["peak_allocated"][0] / 2**30, 3),
        "peak_reserved_gib": round(s["peak_reserved"][0] / 2**30, 3),
        "wall_s": round(time.perf_counter() - began, 1),
        "compiled": result.reports[0].compiled,
    }


def _child(args: argparse.Namespace) -> None:
    load = LOADS[args.load]
    if args.torch_mode:  # torch's own step, traced (--trace)
        from benchmarks.kernel_mix import torch_traced

        print("ROW " + json.dumps(torch_traced(load, args.torch_mode, args.trace)), flush=True)
        return
    variant = Variant(**json.loads(args.variant))
    row = {"load": args.load, "side": "pipecast", "mode": variant.name, **_pipecast(load, variant)}
    print("ROW " + json.dumps(row), flush=True)


def _run(cmd: list[str], timeout: float) -> tuple[dict[str, Any] | None, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    for line in p.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:]), ""
        if line.startswith("{"):
            return json.loads(line), ""
    return None, (p.stderr or p.stdout)[-1500:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="first")
    ap.add_argument("--out", default="one-gpu-out")
    ap.add_argument("--budget", type=float, default=540.0)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--load")
    ap.add_argument("--variant")
    ap.add_argument("--torch-mode", default="")
    ap.add_argument(
        "--trace", default="", help="trace one step of every run to DIR (benchmarks.kernel_mix)"
    )
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    for load_name, modes, variants in SETS[args.set]:
        load = LOADS[load_name]
        child = [sys.executable, "-m", "benchmarks.one_gpu", "--child", "--load", load_name]
        todo: list[tuple[str, list[str]]] = [
            (
                f"torch {m}",
                [*child, "--torch-mode", m, "--trace", f"{args.trace}/{load_name}_torch_{m}"]
                if args.trace
                else [sys.executable, str(ANCHOR), "--mode", m, *load.anchor_args()],
            )
            for m in modes
        ]
        todo += [
            (f"pipecast {v.name}", [*child, "--variant", json.dumps(v.__dict__)]) for v in variants
        ]
        if args.trace:
            Path(args.trace).mkdir(parents=True, exist_ok=True)
        for name, cmd in todo:
            left = args.budget - (time.monotonic() - began)
            if left < 20:
                print(f"skipped {load_name} {name}: budget spent", flush=True)
                continue
            t0 = time.monotonic()
            if args.trace and name.startswith("pipecast"):
                safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
                os.environ["ONE_GPU_TRACE"] = f"{args.trace}/{load_name}_{safe}"
            row, why = _run(cmd, left)
            took = time.monotonic() - t0
            if row is None:
                print(f"FAILED {load_name} {name} ({took:.0f} s): {why}", flush=True)
                continue
            row.update(load=load_name, run=name, process_s=round(took, 1))
            rows.append(row)
            with (out / "runs.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{load_name:9} {name:44} {row.get('step_ms', '-'):>9} ms  "
                  f"{row.get('peak_alloc_gib', 0):>7} GiB  ({took:.0f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
