"""Where a graphed stage's memory goes: the caching allocator's view after a graphed step.

h100x2-graphs-run2 measured graphed runs well above their predictions, most on the last rank
(ResNet-18 1F1B over 2 GPUs, rank 1: 1.00 GiB against 0.38; VGG-16/CIFAR-10 on one GPU at
M=32: 0.42 against 0.17 while its eager twin held 0.135). This runs a few of those
configurations eager and graphed with torch's memory history on and, after the first graphed
step, reads the allocator's snapshot: every pool's segments (reserved, allocated) and which
allocations made each new segment (their Python frames), beside what the runtime counted
(peak allocated, the slots' pool bytes).

    OUT=/tmp/gm python3 benchmarks/graph_memory.py [--dry-run] [--match TEXT]
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import dump, log, pack

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import pipecast_job
from pipecast.bench.store import Store
from pipecast.runtime.engine import PipelineEngine
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.worker import run_rank

STORED = Path(__file__).resolve().parent / "results" / "h100x2-graphs-run2" / "bench.sqlite"
WANTED = (
    "vgg16/cifar10 b128 pipecast gpipe 1st M=4 ",
    "vgg16/cifar10 b128 pipecast gpipe 1st M=32 ",
    "vgg16/cifar10 b128 pipecast gpipe 2st M=1 ",
    "resnet18/imagenet b128 pipecast 1f1b 2st M=4 ",
    "mobilenetv2/imagenet b128 pipecast 1f1b 2st M=4 ",
    "vgg16/cifar10 b128 pipecast gpipe 2st M=16 ",
    "transformer/embeddings b32 pipecast 1f1b 2st M=8 ",
)


def configs(dry: bool) -> list[BenchConfig]:
    """The eager twins of WANTED from the stored run (steps cut to 3 after 1)."""
    out: dict[str, BenchConfig] = {}
    for row in Store(STORED).rows():
        c = BenchConfig.from_dict(row.config)
        label = c.label() + " "
        for w in WANTED:
            if label.startswith(w) and not c.cuda_graphs and w not in out:
                out[w] = replace(c, suite="graph-memory", steps=3, warmup=1, cuda_graphs=False)
    found = [out[w] for w in WANTED if w in out]
    if dry:
        found = [replace(c, device="cpu", dtype="fp32", batch=8) for c in found[:1]]
    return found


def _frames(frames: list[dict[str, Any]], depth: int = 6) -> str:
    """The innermost `depth` Python frames, shortened."""
    out = []
    for f in frames[:depth]:
        name = str(f.get("filename", "?"))
        short = "/".join(name.split("/")[-2:])
        out.append(f"{short}:{f.get('line')}:{f.get('name')}")
    return " < ".join(out)


def _summary(snapshot: dict[str, Any], device: int) -> dict[str, Any]:
    pools: dict[str, dict[str, Any]] = {}
    for seg in snapshot["segments"]:
        if seg.get("device", device) != device:
            continue
        pid = str(tuple(seg.get("segment_pool_id") or (0, 0)))
        p = pools.setdefault(pid, {"segments": 0, "reserved": 0, "allocated": 0, "sizes": []})
        p["segments"] += 1
        p["reserved"] += seg["total_size"]
        p["allocated"] += seg["allocated_size"]
        p["sizes"].append(seg["total_size"])
        live = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
        p.setdefault("largest_live", []).extend(
            (b["size"], _frames(b.get("frames") or [])) for b in live
        )
    for p in pools.values():
        p["sizes"] = sorted(p["sizes"], reverse=True)[:40]
        p["largest_live"] = sorted(p["largest_live"], reverse=True)[:8]
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    grown: Counter[str] = Counter()
    grown_bytes: Counter[str] = Counter()
    big: list[tuple[int, str, str]] = []
    for t in trace:
        if t["action"] == "segment_alloc":
            where = _frames(t.get("frames") or [])
            grown[where] += 1
            grown_bytes[where] += t["size"]
        elif t["action"] == "alloc" and t["size"] >= 8 * 2**20:
            big.append((t["size"], str(t.get("stream")), _frames(t.get("frames") or [])))
    return {
        "pools": pools,
        "segment_allocs": [
            {"where": w, "count": grown[w], "bytes": grown_bytes[w]}
            for w, _ in grown_bytes.most_common(25)
        ],
        "large_allocs": sorted(big, reverse=True)[:25],
    }


def _rank(ctx: Context, cfg: BenchConfig) -> dict[str, Any]:
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
    seen: dict[str, Any] = {}
    original = PipelineEngine.step

    def step(self: PipelineEngine, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        graphed = self._graphs.active(self._shape_key)
        seen.setdefault("peaks", []).append(
            {
                "graphed": graphed,
                "peak_allocated": result.peak_allocated,
                "peak_reserved": result.peak_reserved,
                "pool_bytes": self._graphs.pool_bytes,
                "pool_reserved": sum(g.pool_reserved for g in self._graphs._stages.values()),
                "allocated_now": torch.cuda.memory_allocated(ctx.device) if cuda else 0,
                "reserved_now": torch.cuda.memory_reserved(ctx.device) if cuda else 0,
            }
        )
        wanted = graphed or (not cfg.cuda_graphs and len(seen["peaks"]) == 2)
        if cuda and "snapshot" not in seen and wanted:
            seen["snapshot"] = _summary(torch.cuda.memory._snapshot(), ctx.device.index or 0)
        return result

    PipelineEngine.step = step  # type: ignore[method-assign]
    try:
        run_rank(ctx, pipecast_job(cfg))
    finally:
        PipelineEngine.step = original  # type: ignore[method-assign]
        if cuda:
            torch.cuda.memory._record_memory_history(enabled=None)
    return {"rank": ctx.rank, **seen}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--match", default="")
    args = ap.parse_args()
    backend = "gloo" if args.dry_run else "nccl"
    rows = []
    for cfg in configs(args.dry_run):
        for graphs in (False, True):
            c = replace(cfg, cuda_graphs=graphs and not args.dry_run)
            if args.match not in c.label():
                continue
            try:
                ranks = spawn(_rank, c.gpus, (c,), backend=backend, timeout_s=200)
            except Exception as exc:  # report and go on
                log(f"{c.label()}: FAILED {str(exc)[:1500]}")
                rows.append({"label": c.label(), "error": str(exc)[:4000]})
                continue
            for r in ranks:
                last = r["peaks"][-1]
                log(
                    f"{c.label()} rank {r['rank']}: peak {last['peak_allocated'] / 2**30:.3f} "
                    f"GiB (pool bytes {last['pool_bytes'] / 2**30:.3f}, pool reserved "
                    f"{last['pool_reserved'] / 2**30:.3f}), reserved "
                    f"{last['peak_reserved'] / 2**30:.3f}"
                )
                for pid, p in (r.get("snapshot") or {}).get("pools", {}).items():
                    log(
                        f"   pool {pid}: {p['segments']} segments, reserved "
                        f"{p['reserved'] / 2**20:.1f} MiB, allocated {p['allocated'] / 2**20:.1f}"
                    )
            rows.append({"label": c.label(), "graphed": graphs, "ranks": ranks})
            dump("graph_memory.json", rows)
    pack()


if __name__ == "__main__":
    main()
