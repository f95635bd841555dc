"""How fast this process's host runs right now: seconds of a fixed pure-Python loop.

Where the host binds, a step takes as long as the host needs to issue it, and on shared or
virtual machines the host's speed moves: the same loop timed seconds apart on one machine
can take twice as long (docs/decisions.md, "The host's spells"). The profiler records it
beside its host times and the bench beside every measured step, so a host-bound miss can be
told apart from a host that ran slower than when it was profiled.

The loop measures the interpreter. `issue` measures what a host-bound step spends its host
time on: torch's dispatcher, autograd and kernel launches, timed on a fixed tiny model. The
profiler reads it beside its host costs and the probe in the ranks, alone and n at a time,
so the simulator scales profiled host costs to the speed of a busy rank.
"""

from __future__ import annotations

import platform
import socket
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from pipecast.runtime import devices

ITERATIONS = 200_000


def machine() -> str:
    """Which machine this process runs on, as this boot of it: the host name and the
    kernel's boot id where it has one. A profile and a probe that read the same are from one
    machine, so their host readings can be compared as readings of one host."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}" if boot else socket.gethostname()


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The host CPU's model name as the kernel reports it ('model name' in `cpuinfo`),
    else as Python's platform module does ('' where neither says)."""
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor()


def reference(repeats: int = 5) -> float:
    """Median seconds of `repeats` runs of the fixed loop (about 10 ms each on a 2026 server
    core)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        total = 0
        for i in range(ITERATIONS):
            total += i % 7
        times.append(time.perf_counter() - began)
    return statistics.median(times)


LAYERS, WIDTH = 16, 32
_models: dict[str, tuple[nn.Module, torch.Tensor]] = {}


def _model(device: torch.device) -> tuple[nn.Module, torch.Tensor]:
    key = str(device)
    if key not in _models:
        generator = torch.Generator().manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(LAYERS):  # set from its own generator: the global one stays untouched
            linear = nn.utils.skip_init(nn.Linear, WIDTH, WIDTH)  # type: ignore[no-untyped-call]
            with torch.no_grad():
                linear.weight.copy_(torch.randn(WIDTH, WIDTH, generator=generator) / WIDTH)
                linear.bias.zero_()
            layers += [linear, nn.ReLU()]
        x = torch.randn(2, WIDTH, generator=generator)
        _models[key] = (nn.Sequential(*layers).to(device), x.to(device))
    return _models[key]


def issue(device: torch.device | str = "cpu", repeats: int = 5) -> float:
    """Median host seconds to issue the forward and backward of a fixed tiny model (16
    Linear+ReLU layers, width 32, batch 2) on `device`, the device idle at the start of each
    (a few ms on a 2026 server core; on CPU the tiny compute is included)."""
    device = torch.device(device)
    model, x = _model(device)
    return step_seconds(model, x, device, repeats=repeats, warmup=1, zero_grad=True)


def step_seconds(
    model: nn.Module,
    x: torch.Tensor,
    device: torch.device,
    *,
    repeats: int,
    warmup: int,
    zero_grad: bool = False,
) -> float:
    """Median host seconds to issue one forward of `model` on `x` and the backward of its
    sum, the device idle at the start of each (after `warmup` untimed ones); `zero_grad`:
    the gradients are dropped between steps rather than accumulated."""
    times = []
    for _ in range(warmup + repeats):
        devices.synchronize(device)
        began = time.perf_counter()
        model(x).sum().backward()
        times.append(time.perf_counter() - began)
        if zero_grad:
            model.zero_grad(set_to_none=True)
    devices.synchronize(device)
    return statistics.median(times[warmup:])
