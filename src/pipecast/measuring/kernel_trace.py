"""One step under torch.profiler: its kernels, copies and host threads, summed.

`pipecast train --kernel-trace` traces the step before the last on rank 0 and writes the
profiler's chrome trace (gzipped, for Perfetto) and a summary beside the run's own trace. The
summary answers the questions a slow step raises, without opening the trace:

- busy: the union of the device's kernel and copy intervals, against the step's span (the
  rest is the device waiting);
- compute: the union of kernels alone, and kernels by kind (matrix multiplies, attention,
  the optimizer, inductor's fused kernels, other elementwise);
- copies by direction (host to device, device to host, on the device): milliseconds and
  bytes, and how much of their time ran beside a kernel (overlapped);
- each host thread's busy time in top-level operators (union), named by the operator it
  spends most time in: the engine's thread, autograd's, the host optimizer's.

Intervals are unions, not sums: two kernels on two streams at once count once toward busy.
"""

from __future__ import annotations

import gzip
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
"""A kernel's kind, by the first kind one of whose marks its name contains."""

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

Span = tuple[float, float]


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, marks in KINDS:
        if any(m in low for m in marks):
            return kind
    return "elementwise"


def union(spans: list[Span]) -> list[Span]:
    """The disjoint intervals covering `spans` (start, end), in order."""
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(spans: list[Span]) -> float:
    return sum(b - a for a, b in spans)


def overlap(a: list[Span], b: list[Span]) -> float:
    """How long the disjoint, ordered interval lists `a` and `b` cover together."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def direction(name: str) -> str:
    """A copy's direction from its trace name ("Memcpy HtoD (Pinned -> Device)")."""
    for mark, what in (("HtoD", "to_device"), ("DtoH", "to_host"), ("DtoD", "on_device")):
        if mark in name:
            return what
    return "other"


def _ms(us: float) -> float:
    return round(us / 1e3, 3)


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of a chrome trace's events (times in the trace are microseconds)."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    if not gpu:
        return {"kernels": 0, "host_threads": host_threads(events)}
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]
    busy = union(spans)
    kernels = [e for e in gpu if e["cat"] == "kernel"]
    compute = union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels])
    by_kind: dict[str, float] = {}
    top: dict[str, float] = {}
    for e in gpu:
        by_kind[kind_of(e["name"])] = by_kind.get(kind_of(e["name"]), 0.0) + e["dur"]
        top[e["name"][:90]] = top.get(e["name"][:90], 0.0) + e["dur"]
    copies: dict[str, dict[str, float]] = {}
    for e in gpu:
        if e["cat"] != "gpu_memcpy":
            continue
        row = copies.setdefault(direction(e["name"]), {"ms": 0.0, "gb": 0.0, "spans": []})  # type: ignore[dict-item]
        row["ms"] += e["dur"]
        row["gb"] += float(e.get("args", {}).get("bytes", 0)) / 1e9
        row["spans"].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))  # type: ignore[attr-defined]
    streams: dict[str, float] = {}
    for e in gpu:
        streams[str(e.get("tid"))] = streams.get(str(e.get("tid")), 0.0) + e["dur"]
    return {
        "kernels": len(kernels),
        "span_ms": _ms(busy[-1][1] - busy[0][0]),
        "busy_ms": _ms(length(busy)),
        "compute_ms": _ms(length(compute)),
        "by_kind_ms": {k: _ms(v) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "copies": {
            d: {
                "ms": _ms(r["ms"]),
                "gb": round(r["gb"], 3),
                "beside_compute_ms": _ms(overlap(union(r["spans"]), compute)),  # type: ignore[arg-type]
            }
            for d, r in sorted(copies.items())
        },
        "streams_ms": {s: _ms(v) for s, v in sorted(streams.items(), key=lambda kv: -kv[1])},
        "top_ms": {k: _ms(v) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:15]},
        "host_threads": host_threads(events),
    }


def host_threads(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each host thread's busy time in CPU operators (union) and its busiest operator."""
    ops: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops.setdefault(str(e.get("tid")), []).append(e)
    rows = []
    for tid, mine in ops.items():
        spans = union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in mine])
        names: dict[str, float] = {}
        for e in mine:
            names[e["name"]] = names.get(e["name"], 0.0) + e["dur"]
        rows.append({
            "tid": tid, "busy_ms": _ms(length(spans)), "ops": len(mine),
            "top": [f"{n} {_ms(t)}" for n, t in sorted(names.items(), key=lambda kv: -kv[1])[:4]],
        })  # fmt: skip
    return sorted(rows, key=lambda r: -float(r["busy_ms"]))


class KernelTracer:
    """A TrainJob.before_step callback: traces step `step` (from its start to the next
    step's start) on rank 0, then writes `out`.trace.json.gz and `out`.json (the summary).
    Plain attributes only, so that it travels to spawned ranks."""

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

    def __getstate__(self) -> dict[str, Any]:
        return {"out": self.out, "step": self.step, "prof": None}

    def start(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=acts)
        self.prof.start()

    def stop(self) -> None:
        if self.prof is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.stop()
        raw = Path(self.out + ".trace.json")
        raw.parent.mkdir(parents=True, exist_ok=True)  # the run's folder comes at its end
        self.prof.export_chrome_trace(str(raw))
        self.prof = None
        text = raw.read_text()
        raw.unlink()
        with gzip.open(self.out + ".trace.json.gz", "wt") as f:
            f.write(text)
        events = json.loads(text).get("traceEvents", [])
        Path(self.out + ".json").write_text(json.dumps(summarize(events), indent=1))
