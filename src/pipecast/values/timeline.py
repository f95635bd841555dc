"""Timeline: what happened when, on which rank, and what it cost in time and memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HOST_BOUND = 0.8
"""A step whose busiest host spends this share of it issuing work is host-bound. There the
step is set by how fast Python and the launch path run, which varies between machines and
runs by tens of per cent; device-bound predictions hold to a few per cent."""


@dataclass(frozen=True, slots=True)
class Event:
    rank: int
    name: str
    """'0F3', 'send 0F3', 'allreduce s0', 'optimizer'."""
    kind: str
    """F, B, W, BW, send, allreduce or optimizer."""
    start: float
    end: float
    stage: int = -1
    mb: int = -1

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_row(self) -> list[Any]:
        """Compact JSON form: [rank, name, kind, start, end, stage, mb], times in us."""
        return [
            self.rank,
            self.name,
            self.kind,
            round(self.start * 1e6, 1),
            round(self.end * 1e6, 1),
            self.stage,
            self.mb,
        ]

    @classmethod
    def from_row(cls, row: list[Any]) -> Event:
        rank, name, kind, start, end, stage, mb = row
        return cls(int(rank), str(name), str(kind), start / 1e6, end / 1e6, int(stage), int(mb))


@dataclass(frozen=True, kw_only=True)
class Timeline:
    plan: str
    step_time: float
    events: tuple[Event, ...]
    busy: tuple[float, ...]
    """Seconds each rank computed (F, B, W, BW)."""
    compute_span: float
    """From the first action's start to the last compute action's end."""
    peak_memory: tuple[int, ...]
    """Bytes at each rank's peak: parameters, gradients, optimizer state, activations in
    flight, stashed weights and workspace."""
    exposed_comm: float = 0.0
    """Step time that would disappear if transfers and all-reduces were free."""
    host_busy: tuple[float, ...] = ()
    """Seconds each rank's host spent issuing work."""
    peak_host_memory: tuple[int, ...] = ()
    """Bytes of pinned host memory each rank holds at its peak (offloaded activations;
    empty: none)."""

    @property
    def num_ranks(self) -> int:
        return len(self.busy)

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.compute_span - b for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Share of rank-time idle during the pipelined compute: (S-1)/(M+S-1) for GPipe."""
        if self.compute_span <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.num_ranks * self.compute_span)

    @property
    def host_share(self) -> float:
        """The busiest host's issuing time over the step: near 1, the step is host-bound
        (eager PyTorch at small micro-batches), where timings vary most between machines."""
        if self.step_time <= 0 or not self.host_busy:
            return 0.0
        return max(self.host_busy) / self.step_time

    @property
    def host_bound(self) -> bool:
        return self.host_share >= HOST_BOUND

    def events_of(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]
