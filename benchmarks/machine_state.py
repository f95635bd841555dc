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

import inspect
import json
import os
import statistics
import subprocess
import sys
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
    """The cores' current clock in MHz (min, median, max), from /proc/cpuinfo."""
    lines = (_read("/proc/cpuinfo") or "").splitlines()
    mhz = sorted(float(ln.split(":")[1]) for ln in lines if "cpu MHz" in ln)
    if not mhz:
        return None
    return {"min": mhz[0], "median": mhz[len(mhz) // 2], "max": mhz[-1], "cores": len(mhz)}


def snapshot(label: str, *, readings: bool = True) -> dict[str, Any]:
    """The machine's state now; `readings` adds the host-speed readings (pure-Python loop,
    here and in a new interpreter, once pinned to each CPU, and the tiny model's issue time
    on cuda:0 when there is one), a few seconds."""
    from pipecast.hardware import hostspeed

    clocks = _clocks()
    state: dict[str, Any] = {
        "label": label,
        "time": time.time(),
        "machine": hostspeed.machine(),  # host name and boot id, as profiles record it
        "cpu_model": hostspeed.cpu_model() or None,  # as profiles record it
        "affinity": len(os.sched_getaffinity(0)),
        "loadavg": (_read("/proc/loadavg") or "").split()[:3],
        "cpu_times": _cpu_times(),
        "pressure_cpu": _read("/proc/pressure/cpu"),
        "cgroup_cpu_max": (_read("/sys/fs/cgroup/cpu.max") or "").strip() or None,
        "clock_mhz": clocks,
        "smt_siblings": smt_siblings(),
    }
    if readings:
        state["reference_s"] = hostspeed.reference()
        state["reference_fresh_s"] = _fresh_reference()
        state["core_loop_s"] = core_loops()
        try:
            import torch

            if torch.cuda.is_available():
                state["issue_s"] = hostspeed.issue("cuda:0")
        except RuntimeError as err:  # a busy or failed device: the rest still counts
            state["issue_error"] = str(err)
    return state


def smt_siblings() -> list[str] | None:
    """The CPUs that share a physical core, as the kernel lists them (one entry per core,
    e.g. '0,32'), or None where it does not say."""
    groups: set[str] = set()
    for cpu in sorted(os.sched_getaffinity(0)):
        text = _read(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        if text is None:
            return None
        groups.add(text.strip())
    return sorted(groups, key=lambda g: int(g.replace("-", ",").split(",")[0]))


def core_loops(passes: int = 2) -> dict[str, list[float]]:
    """One run of hostspeed's loop on each CPU this process may use, pinned there, `passes`
    times round them all (about 10 ms a run: a second or two on 64 CPUs), by CPU number.
    h100x4-run22's loop readings fell into two groups, about 7.4 and 14 ms, in this process
    and in new interpreters alike, neither side slower for long: if the slow readings
    belong to some CPUs (a busy hyperthread sibling), a CPU reads slow in every pass and
    pinning ranks to the fast ones is the fix; if not, the whole host slows and speeds up."""
    from pipecast.hardware import hostspeed

    allowed = os.sched_getaffinity(0)
    readings: dict[str, list[float]] = {str(c): [] for c in sorted(allowed)}
    try:
        for _ in range(passes):
            for cpu in sorted(allowed):
                os.sched_setaffinity(0, {cpu})
                readings[str(cpu)].append(hostspeed.reference(repeats=1))
    finally:
        os.sched_setaffinity(0, allowed)
    return readings


def core_summary(readings: dict[str, list[float]]) -> str:
    """core_loops() in a line: the fastest, median and slowest CPU's median reading, and how
    many CPUs read more than 1.5x the fastest in every pass and in only some."""
    if not readings:
        return "no CPUs read"
    medians = sorted(statistics.median(r) for r in readings.values())
    fastest = medians[0]
    always = sum(all(t > 1.5 * fastest for t in r) for r in readings.values())
    sometimes = sum(any(t > 1.5 * fastest for t in r) for r in readings.values()) - always
    return (
        f"{len(readings)} CPUs, ms: fastest {fastest * 1e3:.1f}, median "
        f"{medians[len(medians) // 2] * 1e3:.1f}, slowest {medians[-1] * 1e3:.1f}; over 1.5x "
        f"the fastest in every pass on {always}, in some on {sometimes}"
    )


def _in_new_interpreter(args: list[str], code: str, timeout_s: float) -> float | None:
    """The number a new interpreter (`sys.executable` with `args`) prints last on running
    `code`, or None where it failed."""
    try:
        done = subprocess.run(
            [sys.executable, *args, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
        return float(done.stdout.split()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def loop_pair() -> dict[str, float | None]:
    """hostspeed.reference() in this process, then the same function, its source as it
    stands, in a new interpreter that imports nothing else (-S -I: a fraction of a second,
    where _fresh_reference imports torch). gpu_run.py profiles in its own process, which
    read the loop up to 2x slower than a new interpreter at each call's start and end on
    h100x4-run21; read after each profile, the pair tells whether the profiles' host costs
    were read in a slowed process."""
    from pipecast.hardware import hostspeed

    here = hostspeed.reference()
    code = (
        f"import statistics, time\nITERATIONS = {hostspeed.ITERATIONS}\n"
        f"{inspect.getsource(hostspeed.reference)}\nprint(reference())\n"
    )
    return {"here_s": here, "new_s": _in_new_interpreter(["-S", "-I"], code, 60)}


def _fresh_reference() -> float | None:
    """hostspeed.reference() in a new interpreter (a few seconds, most of them importing
    torch). Every call of h100x4-run19 and -run20 read the loop 1.4-2.4x slower in this
    process at its end than at its start; read beside this one, the two tell a machine that
    slowed from a process whose own state slows the loop."""
    code = "from pipecast.hardware import hostspeed; print(hostspeed.reference())"
    return _in_new_interpreter([], code, 120)


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


def loop_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The pure-Python loop's readings in ms from one snapshot to the next, in this process
    and in a new interpreter ('-' where a snapshot took none)."""

    def ms(state: dict[str, Any], key: str) -> str:
        return f"{state[key] * 1e3:.1f}" if state.get(key) else "-"

    return ", ".join(
        f"{where} {ms(before, key)} -> {ms(after, key)}"
        for where, key in (("here", "reference_s"), ("new", "reference_fresh_s"))
    )
