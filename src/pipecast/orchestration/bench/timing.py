"""Timing steps the way the anchors were measured: barrier before and after each step,
warm-up steps first, the median of the rest."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from pipecast.runtime import devices
from pipecast.runtime.launch import all_gather_floats
from pipecast.runtime.worker import StepRecord
from pipecast.values.timeline import Event


def barrier(device: torch.device) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        if device.type == "cuda":
            dist.barrier(device_ids=[device.index or 0])
        else:
            dist.barrier()
    devices.synchronize(device)


def timed_steps(
    step: Callable[[], Any], device: torch.device, *, steps: int, warmup: int
) -> dict[str, Any]:
    devices.reset_peak(device)
    times = []
    for i in range(warmup + steps):
        barrier(device)
        began = time.perf_counter()
        step()
        barrier(device)
        if i >= warmup:
            times.append(time.perf_counter() - began)
    return {
        "step_time": statistics.median(times),
        "step_times": times,
        "peak_allocated": devices.peak_allocated(device),
        "peak_reserved": devices.peak_reserved(device),
    }


def gather_peaks(result: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every rank's peak memory, and the slowest rank's step time, on every rank."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        result["peak_allocated"] = [result["peak_allocated"]]
        result["peak_reserved"] = [result["peak_reserved"]]
        return result
    values = torch.tensor(
        [result["peak_allocated"], result["peak_reserved"], int(result["step_time"] * 1e9)],
        dtype=torch.int64,
        device=device,
    )
    out = [torch.zeros_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(out, values)
    result["peak_allocated"] = [int(v[0]) for v in out]
    result["peak_reserved"] = [int(v[1]) for v in out]
    result["step_time"] = max(int(v[2]) for v in out) / 1e9
    return result


HOST_KINDS = ("F", "B", "W", "BW")


def action_stats(steps: Sequence[StepRecord], events: Sequence[Event]) -> dict[str, float]:
    """This rank's median host seconds per step in its action loop ('loop'), before and
    after it ('before_loop', 'after_loop': the step's fixed costs) and issuing each
    kind of action ('host_F', ...), and the device seconds of each kind in the last step
    ('device_F', ...; from the action clock, zero when it was off), and of each kind's host
    seconds those its thread ran on a CPU ('cpu_F', ...). Where 'loop' nears the
    step time the rank was host-bound: on GPU the host issues work and never waits."""
    out = {
        name: statistics.median([getattr(s, field) for s in steps]) if steps else 0.0
        for name, field in (
            ("loop", "host_loop"),
            ("before_loop", "host_before"),
            ("after_loop", "host_after"),
        )
    }
    for k in HOST_KINDS:
        out[f"host_{k}"] = statistics.median([s.host.get(k, 0.0) for s in steps]) if steps else 0.0
        cpu = [s.host.get(f"cpu_{k}", 0.0) for s in steps]
        out[f"cpu_{k}"] = statistics.median(cpu) if steps else 0.0
        out[f"device_{k}"] = sum(e.end - e.start for e in events if e.kind == k)
        out[f"count_{k}"] = float(sum(e.kind == k for e in events))
    # of which posting sends and receives ('host_transfer'; the runtime times it apart)
    transfer = [s.host.get("transfer", 0.0) for s in steps]
    out["host_transfer"] = statistics.median(transfer) if transfer else 0.0
    return out


def gather_events(events: Sequence[Event]) -> list[list[Any]]:
    """Every rank's timed actions of its last step (Event.to_row), each rank's times from
    its own start of the step (the ranks start together, after agreeing on the batch)."""
    rows = [e.to_row() for e in events]
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return rows
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    return [row for part in gathered for row in part]


def gather_floats(values: dict[str, float], device: torch.device) -> dict[str, list[float]]:
    """Every rank's `values` (the same keys on every rank), key -> one value per rank."""
    keys = sorted(values)
    rows = all_gather_floats([values[k] for k in keys], device)
    return {k: [row[i] for row in rows] for i, k in enumerate(keys)}
