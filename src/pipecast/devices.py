"""Device side effects behind one thin layer: timing, synchronisation and memory statistics.

On CUDA these use events and the caching allocator's counters; on CPU they fall back to
perf_counter and report zero memory, so every caller runs unchanged under gloo on a laptop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

from pipecast.errors import DeviceError

T = TypeVar("T")


def resolve(device: str | torch.device) -> torch.device:
    """A torch.device that exists here, or a DeviceError that says what does."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"'{device}' is not a device name: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = dev.index if dev.index is not None else 0
        if index >= count:
            raise DeviceError(
                f"device {dev} is not there: this machine has {count} CUDA device(s); "
                "use --device cpu or a smaller index"
            )
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise DeviceError(f"device type '{dev.type}' is not supported: use cpu or cuda")
    return dev


def name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], T]) -> tuple[T, float]:
    """Run `fn` and return its result and its device time in seconds."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return result, start.elapsed_time(end) / 1e3
    began = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - began


def timed_with_host(device: torch.device, fn: Callable[[], T]) -> tuple[T, float, float]:
    """Run `fn`: its result, its device time, and the host time it took to issue it (on GPU
    the host returns before the device finishes; on CPU the two are the same)."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        began = time.perf_counter()
        result = fn()
        host = time.perf_counter() - began
        end.record()
        end.synchronize()
        return result, start.elapsed_time(end) / 1e3, host
    began = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - began
    return result, elapsed, elapsed


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_allocated(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def peak_reserved(device: torch.device) -> int:
    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0


def total_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        import os

        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return total_memory(device)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
