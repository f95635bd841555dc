"""Where one step's GPU time goes, by kind of kernel: one traced step, pipecast's or torch's.

    python -m benchmarks.one_gpu --set trace --out DIR

A run traced here is a `benchmarks.one_gpu` run with ONE_GPU_TRACE=DIR/NAME set: the step
before the last runs under torch.profiler, and DIR/NAME.json holds its kernels summed by kind
(matrix multiplies, attention, the optimizer, inductor's fused kernels, other elementwise,
copies), the device's busy time (the union of kernel intervals) and the step's span, so a gap
between two systems' steps can be named: more kernel time of one kind, or idle device time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("optimizer", ("adam", "multi_tensor", "sgd")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "matmul", "sm90", "sm100", "mm_")),
    ("inductor", ("triton",)),
    ("copy", ("memcpy", "memset", "copy")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, marks in KINDS:
        if any(m in low for m in marks):
            return kind
    return "elementwise"


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Kernel milliseconds by kind, busy and span, of a chrome trace's events."""
    kernels = [
        e for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]  # fmt: skip
    if not kernels:
        return {"kernels": 0}
    by_kind: dict[str, float] = {}
    top: dict[str, float] = {}
    for e in kernels:
        by_kind[kind_of(e["name"])] = by_kind.get(kind_of(e["name"]), 0.0) + e["dur"] / 1e3
        top[e["name"][:90]] = top.get(e["name"][:90], 0.0) + e["dur"] / 1e3
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels)
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo, hi = busy + hi - lo, a, b
        else:
            hi = max(hi, b)
    busy += hi - lo
    return {
        "kernels": len(kernels),
        "span_ms": round((max(b for _, b in spans) - spans[0][0]) / 1e3, 2),
        "busy_ms": round(busy / 1e3, 2),
        "by_kind_ms": {k: round(v, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_ms": {k: round(v, 2) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:15]},
    }


class StepTracer:
    """A Job.before_step callback: traces step `step` (from its start to the next step's)
    on rank 0 and writes the summary to `out`.json."""

    def __init__(self, out: str, step: int) -> None:
        self.out, self.step = out, step
        self.prof: Any = None

    def __call__(self, rank: int, step: int) -> None:
        if rank != 0:
            return
        if step == self.step:
            self.start()
        elif step == self.step + 1:
            self.stop()

    def start(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        self.prof = torch.profiler.profile(activities=acts)
        self.prof.start()

    def stop(self) -> None:
        if self.prof is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.stop()
        path = Path(self.out + ".trace.json")
        self.prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
        path.unlink()
        Path(self.out + ".json").write_text(json.dumps(summarize(events), indent=1))
        self.prof = None


def torch_traced(load: Any, mode: str, out: str) -> dict[str, Any]:
    """torch's own step on `load` (the anchor's loop: bf16 weights, fused Adam or SGD,
    `mode` eager, compile (each GPT block) or compile-whole), step 4 traced to `out`."""
    import torch.nn.functional as F

    from pipecast.values.models.workload import Workload

    torch.manual_seed(0)
    dev = torch.device("cuda")
    wl = Workload(
        model=load.model, dataset=load.dataset, width=load.width or 512, layers=load.layers,
        heads=load.heads, seq_len=load.seq or 256,
    )  # fmt: skip
    model = wl.build().to(torch.bfloat16).to(dev)
    if mode == "compile":
        for i, b in enumerate(list(model.children())):
            if load.model != "gpt" or b.__class__.__name__ == "Block":
                model[i] = torch.compile(b)
    elif mode == "compile-whole":
        model = torch.compile(model)
    params = list(model.parameters())
    opt: torch.optim.Optimizer = (
        torch.optim.Adam(params, lr=1e-4, fused=True)
        if load.optim == "adam"
        else torch.optim.SGD(params, lr=1e-3)
    )
    if load.dataset == "tokens":
        x = torch.randint(0, wl.vocab, (load.batch, load.seq), device=dev)
        y = torch.randint(0, wl.vocab, (load.batch, load.seq), device=dev)
    else:
        x = torch.randn((load.batch, *wl.spec.sample_shape), device=dev, dtype=torch.bfloat16)
        y = torch.randint(0, wl.spec.num_classes, (load.batch,), device=dev)
    tracer = StepTracer(out, 4)
    for step in range(6):
        tracer(0, step)
        o = model(x)
        o = o.float().reshape(-1, o.shape[-1]) if load.dataset == "tokens" else o.float()
        F.cross_entropy(o, y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"traced": out}
