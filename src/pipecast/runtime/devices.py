"""Device side effects behind one thin layer: timing, synchronisation and memory statistics.

On CUDA these use events and the caching allocator's counters; on CPU they fall back to
perf_counter and report zero memory, so every caller runs unchanged under gloo on a laptop.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from pipecast.errors import DeviceError
from pipecast.runtime import cpubind

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


def hold(device: torch.device, seconds: float) -> None:
    """Keep `device`'s current stream busy for about `seconds` (a spinning kernel): work the
    host issues next queues up behind it, and the device then runs that work without
    waiting for the host. Nothing on a CPU."""
    if device.type != "cuda" or seconds <= 0:
        return
    with torch.cuda.device(device):
        torch.cuda._sleep(max(int(seconds * _spin_rate(device)), 1))  # type: ignore[no-untyped-call]


_SPIN_RATES: dict[int, float] = {}


def _spin_rate(device: torch.device) -> float:
    """Cycles per second of torch.cuda._sleep on `device`, timed once per process."""
    index = device.index or 0
    if index not in _SPIN_RATES:
        torch.cuda._sleep(1000)  # type: ignore[no-untyped-call]
        cycles = 2_000_000
        _, seconds = timed(device, lambda: torch.cuda._sleep(cycles))  # type: ignore[no-untyped-call]
        _SPIN_RATES[index] = cycles / max(seconds, 1e-6)
    return _SPIN_RATES[index]


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


def clock(
    device: torch.device,
) -> tuple[Callable[[], object], Callable[[object, object], float]]:
    """A mark now on `device`'s current stream (a timing event on a GPU, the host's clock
    on a CPU), and the seconds between two marks (on a GPU, read once both have passed)."""
    if device.type == "cuda":

        def event() -> object:
            e = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            e.record()
            return e

        def between(a: object, b: object) -> float:
            assert isinstance(a, torch.cuda.Event) and isinstance(b, torch.cuda.Event)
            return float(a.elapsed_time(b)) / 1e3

        return event, between

    def now() -> object:
        return time.perf_counter()

    def elapsed(a: object, b: object) -> float:
        assert isinstance(a, float) and isinstance(b, float)
        return b - a

    return now, elapsed


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


def free_host_memory() -> int | None:
    """Bytes of this machine's memory free for a new allocation without swapping, as the
    kernel estimates them (MemAvailable: free pages and the caches it can drop); None where
    it does not say. Pinned memory can't be swapped out, so this is what it can take."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_on_gpus() -> list[int] | None:
    """Free bytes on each GPU of this machine as the driver reports them, read without
    creating a CUDA context here (a context would take memory from rank 0 for the whole
    run); None where the driver's tool is not there to ask."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return [int(float(line)) * 2**20 for line in out.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def local_cpus(device: torch.device) -> set[int]:
    """The CPUs on the GPU's own NUMA node that this process may use (empty: unknown). A
    host issuing kernels from the far socket pays for every launch crossing it."""
    if device.type != "cuda" or not hasattr(os, "sched_getaffinity"):
        return set()
    props = torch.cuda.get_device_properties(device)
    bus, slot = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
    if bus is None or slot is None:
        return set()
    domain = int(getattr(props, "pci_domain_id", 0) or 0)
    path = f"/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{slot:02x}.0/local_cpulist"
    try:
        with open(path) as f:
            cpus = cpubind.parse_cpulist(f.read())
    except (OSError, ValueError):
        return set()
    return cpus & os.sched_getaffinity(0)


def rank_cpus(device: torch.device, local_world: int, limit: int = 0) -> set[int]:
    """This rank's share of its GPU's NUMA node: the node's whole cores split in turn among
    the first `local_world` GPUs on that node, the share's first `limit` cores where that
    is above 0 (empty: unknown)."""
    mine = local_cpus(device)
    if not mine:
        return set()
    sharers = [i for i in range(local_world) if local_cpus(torch.device("cuda", i)) == mine]
    index = device.index or 0
    if index not in sharers:
        return mine
    return cpubind.share(cpubind.cores(mine), len(sharers), sharers.index(index), limit)


def pin_host(device: torch.device, local_world: int = 0) -> int:
    """Keep this process (and the threads it starts from now on) on the GPU's NUMA node,
    or with `local_world` ranks on this machine and `PIPECAST_CPU_BIND=rank[:N]` on this
    rank's share of it; the number of CPUs it may use, 0 where nothing was changed."""
    mode, limit = cpubind.policy() if local_world else ("node", 0)
    if mode == "off":
        return 0
    cpus = rank_cpus(device, local_world, limit) if mode == "rank" else local_cpus(device)
    if not cpus:
        return 0
    os.sched_setaffinity(0, cpus)
    return len(cpus)


@contextlib.contextmanager
def pinned(device: torch.device) -> Iterator[int]:
    """`pin_host` for the duration of the block, then the affinity from before."""
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    count = pin_host(device)
    try:
        yield count
    finally:
        if count and before:
            os.sched_setaffinity(0, before)


def clear_workspaces() -> bool:
    """Free every cuBLAS workspace this process keeps (one per thread and stream, kept for
    the process's life; False where torch can't)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        return False
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        clear()
    return True
