"""A step of sharded data parallelism (torch's FSDP, fully_shard) in time and memory.

Each replica holds 1/R of every unit's weights, gradients and optimizer state. Per
micro-batch, in order:

- forward: each unit's weights are all-gathered before its forward. The gathers run one
  after another on the communication channel, the next one issued while the unit before
  it computes, and at most two units are gathered at once (the current and the next), so a
  gather waits for the forward two units back to finish;
- backward, last unit first: with 'full' resharding each unit is gathered again (the last
  unit is kept from its forward), prefetched one unit ahead as the forward's were; with
  'grad' every unit stayed gathered since its forward. After a unit's backward its
  gradients are reduce-scattered on the same channel, in the order they are ready;
- after the last micro-batch's last reduce-scatter, each replica steps its optimizer over
  its shard.

The channel carries gathers and reduce-scatters in the order the hooks issue them, each
starting once the channel is free and its input exists; only what the compute waits for is
exposed: the first gather, and the reduce-scatters after the last backward.

Memory per GPU is the shards (weights, gradients, optimizer state: 1/R each) plus, at each
moment, the gathered units' weights, the saved activations of the micro-batch in flight,
and a unit's full gradient with its reduce-scatter input while they exist.

Recomputed (ShardedStep.recomputed micro-batches), each unit is a checkpoint of its own
(pipecast.runtime.recompute): its forward keeps only `Unit.kept_bytes`, and its backward
first runs its forward again (`Unit.recompute` seconds), holding all its activations while
it runs. The recomputed forward uses the weights the backward gathers anyway (resharded
after the forward, each unit but the last is gathered again for its backward, recomputed
or not): it adds compute, not communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pipecast.values.timeline import Event, Timeline

Reshard = Literal["full", "grad"]


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One sharded unit of consecutive blocks, at one micro-batch's size."""

    forward: float
    """Seconds of its forward (the compute's, or its host's where that binds)."""
    backward: float
    """Seconds of its whole backward."""
    gather: float
    """Seconds to all-gather its weights over the replicas."""
    scatter: float
    """Seconds to reduce-scatter its gradients over the replicas."""
    optimizer: float
    """Seconds of the optimizer step over its shard."""
    param_bytes: int
    """Bytes of its whole (unsharded) weights; its gradients are as large."""
    activation_bytes: int
    """Bytes its forward keeps for its backward, one micro-batch."""
    recompute: float = 0.0
    """Seconds a recomputed backward spends running its forward (or part of it) again."""
    kept_bytes: int = 0
    """Bytes a recomputed micro-batch's forward keeps for it: its checkpoint's input, and
    under selective recomputation the outputs of its products and attention."""


@dataclass(frozen=True, kw_only=True)
class ShardedStep:
    """What sharded_step needs besides the units."""

    replicas: int
    microbatches: int = 1
    reshard: Reshard = "full"
    state_bytes: float = 0.0
    """Optimizer state per weight byte (OPTIMIZER_STATE), sharded like the weights."""
    temporary_bytes: float = 0.0
    """The optimizer step's temporaries per weight byte (OPTIMIZER_TEMPORARY)."""
    fixed_bytes: int = 0
    """Held whatever happens: library workspaces, the step's batch."""
    workspace_bytes: int = 0
    """Transient bytes of the largest unit's compute beyond what it keeps."""
    recomputed: int = 0
    """Micro-batches, the first ones, whose backward recomputes every unit's forward (all
    of them, or all but the last: pipecast.values.training.recomputes)."""


class _Channel:
    """The gathers and reduce-scatters, one at a time, in the order they are issued."""

    def __init__(self, events: list[Event]) -> None:
        self.free, self.events = 0.0, events

    def run(self, name: str, kind: str, ready: float, seconds: float) -> float:
        if seconds <= 0:
            return ready
        start = max(self.free, ready)
        self.free = start + seconds
        self.events.append(Event(0, name, kind, start, self.free))
        return self.free


def sharded_step(units: Sequence[Unit], step: ShardedStep, name: str = "fsdp") -> Timeline:
    """The step in time (rank 0's events; every replica runs the same) and its peak memory."""
    events: list[Event] = []
    channel = _Channel(events)
    compute = 0.0
    u = len(units)
    for mb in range(step.microbatches):
        forward_end = [0.0] * u
        began = compute
        for i, unit in enumerate(units):
            may_gather = forward_end[i - 2] if i >= 2 else began
            ready = channel.run(f"gather u{i}", "allgather", may_gather, unit.gather)
            start = max(compute, ready)
            compute = forward_end[i] = start + unit.forward
            events.append(Event(0, f"F u{i}", "F", start, compute, i, mb))
        gathered = [0.0] * u  # when each unit's weights are back for its backward
        for i in reversed(range(u)):
            unit = units[i]
            start = max(compute, gathered[i])
            if step.reshard == "full" and i > 0:  # the unit before, prefetched as this starts
                gathered[i - 1] = channel.run(
                    f"gather u{i - 1}", "allgather", start, units[i - 1].gather
                )
            again = unit.recompute if mb < step.recomputed else 0.0
            compute = start + unit.backward + again
            events.append(Event(0, f"BW u{i}", "BW", start, compute, i, mb))
            channel.run(f"scatter u{i}", "reduce_scatter", compute, unit.scatter)
    begin = max(compute, channel.free)
    optimizer = sum(unit.optimizer for unit in units)
    if optimizer > 0:
        events.append(Event(0, "optimizer", "optimizer", begin, begin + optimizer))
    peak = _peak_memory(units, step)
    busy = sum(e.duration for e in events if e.kind in ("F", "BW"))
    return Timeline(
        plan=name,
        step_time=begin + optimizer,
        events=tuple(events),
        busy=(busy,) * step.replicas,
        compute_span=compute,
        peak_memory=(peak,) * step.replicas,
        exposed_comm=max(begin + optimizer - busy - optimizer, 0.0),
    )


def _peak_memory(units: Sequence[Unit], step: ShardedStep) -> int:
    """The shards plus the most the step holds at once: the end of the forward (every
    activation, the last units gathered) or a unit's backward (its gradient and its
    reduce-scatter input beside the activations not yet freed); the larger of a recomputed
    micro-batch's and a plain one's, where the step has both."""
    whole = sum(unit.param_bytes for unit in units)
    shards = whole / step.replicas * (2.0 + step.state_bytes)
    kinds = {mb < step.recomputed for mb in range(step.microbatches)}
    moments = [0.0, *(m for again in kinds for m in _moments(units, step.reshard, again))]
    stepping = whole / step.replicas * step.temporary_bytes
    transient = max(max(moments) + step.workspace_bytes, stepping)
    return int(shards + transient + step.fixed_bytes)


def _moments(units: Sequence[Unit], reshard: Reshard, recomputed: bool) -> list[float]:
    """Bytes of activations and gathered weights and gradients at the end of each unit's
    forward and during each unit's backward, one micro-batch (`recomputed` or not)."""
    moments = []
    kept = [unit.kept_bytes if recomputed else unit.activation_bytes for unit in units]
    saved = 0.0
    for i in range(len(units)):
        saved += kept[i]
        moments.append(saved + _gathered(units, i, reshard, forward=True))
    for i in reversed(range(len(units))):
        gradient = 2 * units[i].param_bytes  # the gradient and its reduce-scatter input
        again = max(units[i].activation_bytes - kept[i], 0)  # what its forward makes again
        gathered = _gathered(units, i, reshard, forward=False)
        moments.append(saved + again + gathered + gradient)
        saved -= kept[i]
    return moments


def _gathered(units: Sequence[Unit], i: int, reshard: Reshard, *, forward: bool) -> float:
    """Bytes of whole weights gathered while unit `i` computes."""
    if reshard == "grad":  # gathered from its forward until its own backward
        return float(sum(unit.param_bytes for unit in units[: i + 1 + forward]))
    near = (i, i + 1) if forward else (i, i - 1)  # the unit and the one prefetched
    return float(sum(units[j].param_bytes for j in near if 0 <= j < len(units)))
