"""What the host looked like when a call of a GPU script ran: one JSON line per reading in
OUT/machine_state.jsonl, appended (a run resumed over several calls keeps every call's).

The host-bound rows of the 4-GPU suites moved 20-87% between calls of one run while the
pure-Python loop and the tiny model's issue time did not follow them. These readings are the
ones a shared or virtual machine can change between calls without the interpreter noticing:
time stolen by the hypervisor and CPU pressure (from /proc/stat and /proc/pressure/cpu, read
at both ends of a call, so the call's share can be told), the cores' clock, the CPUs this
process may run on, the cgroup's CPU quota and whether the machine rebooted (boot id).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _cpu_times() -> dict[str, int] | None:
    """The whole machine's CPU jiffies by kind, from /proc/stat's first line."""
    text = _read("/proc/stat")
    if not text:
        return None
    fields = text.splitlines()[0].split()[1:]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {n: int(v) for n, v in zip(names, fields, strict=False)}


def _clocks() -> dict[str, float] | None:
    """The cores' current clock in MHz from /proc/cpuinfo: min, median, max."""
    text = _read("/proc/cpuinfo")
    if not text:
        return None
    mhz = sorted(float(line.split(":")[1]) for line in text.splitlines() if "cpu MHz" in line)
    if not mhz:
        return None
    return {"min": mhz[0], "median": mhz[len(mhz) // 2], "max": mhz[-1], "cores": len(mhz)}


def _model() -> str | None:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def snapshot(label: str, *, readings: bool = True) -> dict[str, Any]:
    """The machine's state now; `readings` adds the host-speed readings (pure-Python loop,
    and the tiny model's issue time on cuda:0 when there is one), about a second."""
    state: dict[str, Any] = {
        "label": label,
        "time": time.time(),
        "host": socket.gethostname(),
        "boot_id": (_read("/proc/sys/kernel/random/boot_id") or "").strip(),
        "cpu_model": _model(),
        "affinity": len(os.sched_getaffinity(0)),
        "loadavg": (_read("/proc/loadavg") or "").split()[:3],
        "cpu_times": _cpu_times(),
        "pressure_cpu": _read("/proc/pressure/cpu"),
        "cgroup_cpu_max": (_read("/sys/fs/cgroup/cpu.max") or "").strip() or None,
        "clock_mhz": _clocks(),
    }
    if readings:
        from pipecast import hostspeed

        state["reference_s"] = hostspeed.reference()
        try:
            import torch

            if torch.cuda.is_available():
                state["issue_s"] = hostspeed.issue("cuda:0")
        except RuntimeError as err:  # a busy or failed device: the rest still counts
            state["issue_error"] = str(err)
    return state


def record(out: Path, label: str, *, readings: bool = True) -> dict[str, Any]:
    """snapshot() appended to out/machine_state.jsonl; returns it."""
    state = snapshot(label, readings=readings)
    with open(out / "machine_state.jsonl", "a") as fh:
        fh.write(json.dumps(state) + "\n")
    return state


def steal_share(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """The share of the machine's CPU time the hypervisor stole between two snapshots."""
    a, b = before.get("cpu_times"), after.get("cpu_times")
    if not a or not b or "steal" not in a or "steal" not in b:
        return None
    total = sum(b.values()) - sum(a.values())
    return (b["steal"] - a["steal"]) / total if total > 0 else None
