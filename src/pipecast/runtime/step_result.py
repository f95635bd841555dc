"""What one step of the engine gives back (`StepResult`), and what its action loop leaves
for the rest of the step (`StepRun`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import torch

from pipecast.runtime import allreduce
from pipecast.runtime.events import StepMarks
from pipecast.values.timeline import Event


@dataclass
class StepResult:
    loss: float | None
    """Mean loss over this replica's batch (on the rank holding the last stage)."""
    seconds: float
    """Host seconds the step took to issue; on a GPU its device may still be running it
    (the caller synchronises where it times steps)."""
    marks: StepMarks | None = None
    """The step's timed actions, resolved into `events` when first read."""
    peak_allocated: int = 0
    """Peak bytes allocated; with CUDA graphs replayed, their pool counted whole."""
    peak_reserved: int = 0
    outputs: list[torch.Tensor] = field(default_factory=list)
    """Forward-only plans: the last stage's outputs, one per micro-batch."""
    host: dict[str, float] = field(default_factory=dict)
    """Host seconds spent issuing each kind of action (F, B, W, BW), transfers included,
    summed over the step, and posting the transfers alone ('transfer'); with `host_loop`
    (the whole action loop) it shows whether the rank was host-bound: on GPU the host only
    issues work and never waits for the device. 'cpu_F', ...: of those seconds, the ones
    this thread ran on a CPU (time.thread_time); the rest it waited (for a lock, the GIL,
    the device or the scheduler)."""
    host_loop: float = 0.0
    host_before: float = 0.0
    """Seconds of the step before its action loop (agreeing on the batch's shape with the
    other ranks, splitting it into micro-batches)."""
    host_after: float = 0.0
    """Seconds of the step after its action loop (waiting for sends and all-reduces, the
    optimizer step, the loss, waiting for the device)."""
    grad_norm: float | None = None
    """The gradients' global L2 norm before clipping (RunConfig.clip_grad_norm; None: not
    clipped)."""
    skipped: bool = False
    """Dynamic loss scaling found an overflow: the optimizer did not step."""
    loss_scale: float = 0.0
    """The loss scale this step ran with (0: no scaling)."""
    graphs_replayed: int = 0
    """CUDA graphs (pipecast.runtime.graphs) the step replayed; 0: it ran eagerly."""

    @cached_property
    def events(self) -> list[Event]:
        """The step's actions with their start and end (device times on GPU) from the
        step's start; reading them the first time waits for the device."""
        return self.marks.resolve() if self.marks is not None else []


@dataclass
class StepRun:
    """What a step's action loop leaves for the rest of the step."""

    loss_sum: torch.Tensor | None = None
    outputs: list[torch.Tensor] = field(default_factory=list)
    pending_reduce: list[allreduce.Bucket] = field(default_factory=list)
    host: dict[str, float] = field(default_factory=dict)
    graphs_replayed: int = 0


Tick = tuple[float, float]
"""(wall seconds, this thread's CPU seconds) at a point of the action loop."""


def tick() -> Tick:
    return time.perf_counter(), time.thread_time()


def charge(host: dict[str, float], kind: str, since: Tick) -> Tick:
    """Charge the host seconds since `since` (wall, this thread's CPU) to `kind`; now."""
    now, cpu_now = tick()
    host[kind] = host.get(kind, 0.0) + now - since[0]
    cpu = "cpu_" + kind
    host[cpu] = host.get(cpu, 0.0) + cpu_now - since[1]
    return now, cpu_now
