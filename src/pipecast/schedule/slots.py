"""Memory slots: which of a stage's in-flight micro-batches may share buffers.

A CUDA-graphed stage (pipecast.runtime.graphs) reads and writes fixed addresses, so each
micro-batch it holds at once needs buffers of its own. `slots` walks one rank's actions and
gives every (stage, micro-batch) the lowest slot free at its forward, freed by its whole
backward: GPipe holds all M micro-batches, 1F1B at most as many as stages remain. The
simulator counts the same slots to predict a graphed run's memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipecast.errors import ConfigError
from pipecast.schedule.action import Action


def slots(actions: Sequence[Action]) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
    """(stage, micro-batch) -> slot, and slots needed per stage, for one rank's actions:
    each forward takes its stage's lowest free slot, each whole backward frees it."""
    free: dict[int, list[int]] = {}
    count: dict[int, int] = {}
    held: dict[tuple[int, int], int] = {}
    out: dict[tuple[int, int], int] = {}
    for a in actions:
        key = (a.stage, a.mb)
        if a.kind == "F":
            pool = free.setdefault(a.stage, [])
            if pool:
                slot = min(pool)
                pool.remove(slot)
            else:
                slot = count.get(a.stage, 0)
                count[a.stage] = slot + 1
            held[key] = out[key] = slot
        elif a.kind == "BW":
            if key not in held:
                raise ConfigError(f"action {a} frees a slot its forward never took")
            free.setdefault(a.stage, []).append(held.pop(key))
        else:
            raise ConfigError(f"action {a}: CUDA graphs need whole backwards")
    return out, count
