"""The kernel trace's summary against intervals counted by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from pipecast.measuring.kernel_trace import KernelTracer, overlap, summarize, union


def _x(cat: str, name: str, ts: float, dur: float, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_union_and_overlap_by_hand() -> None:
    assert union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert overlap([(0, 3), (5, 8)], [(2, 6)]) == 2  # 2-3 and 5-6


def test_summary_counts_unions_not_sums() -> None:
    events = [
        _x("kernel", "sm90_xmma_gemm", 0, 100, 7),  # compute 0-100
        _x("kernel", "triton_poi_fused", 50, 100, 20),  # another stream, 50-150
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 120, 60, 30, bytes=2e9),  # 120-180
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 300, 10, 31, bytes=1e9),  # alone
        _x("cpu_op", "aten::_fused_adam_", 0, 40, 2),
        _x("cpu_op", "aten::_fused_adam_", 30, 20, 2),  # inside the thread's 0-50
        _x("cpu_op", "aten::mm", 0, 5, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 0, 1, 1),  # not an operator
    ]
    s = summarize(events)
    assert s["kernels"] == 2
    assert s["span_ms"] == 0.31  # 0 to 310 us
    assert s["busy_ms"] == 0.19  # 0-180 and 300-310
    assert s["compute_ms"] == 0.15
    assert s["by_kind_ms"] == {"matmul": 0.1, "inductor": 0.1, "copy": 0.07}
    assert s["copies"]["to_device"] == {"ms": 0.06, "gb": 2.0, "beside_compute_ms": 0.03}
    assert s["copies"]["to_host"] == {"ms": 0.01, "gb": 1.0, "beside_compute_ms": 0.0}
    adam, mm = s["host_threads"]
    assert (adam["tid"], adam["busy_ms"], adam["ops"]) == ("2", 0.05, 2)
    assert adam["top"][0].startswith("aten::_fused_adam_") and mm["busy_ms"] == 0.005


def test_a_trace_without_a_gpu_still_names_its_threads() -> None:
    s = summarize([_x("cpu_op", "aten::add", 0, 3, 9)])
    assert s == {"kernels": 0, "host_threads": [
        {"tid": "9", "busy_ms": 0.003, "ops": 1, "top": ["aten::add 0.003"]}
    ]}  # fmt: skip


def test_the_tracer_writes_into_a_folder_the_run_has_not_made_yet(tmp_path: Path) -> None:
    """The run's own folder is made when its traces are written, after the traced step."""
    tracer = KernelTracer(str(tmp_path / "later" / "run.kernels"), step=1)
    for step in range(3):
        tracer(0, step)
        torch.ones(64, 64).matmul(torch.ones(64, 64))
    summary = json.loads((tmp_path / "later" / "run.kernels.json").read_text())
    assert any("aten::matmul" in " ".join(t["top"]) for t in summary["host_threads"])
    assert (tmp_path / "later" / "run.kernels.trace.json.gz").stat().st_size > 0
    tracer(1, 1)  # another rank's steps trace nothing
    assert tracer.prof is None
