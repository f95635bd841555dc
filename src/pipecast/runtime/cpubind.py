"""Which CPUs a rank's host runs on: its GPU's NUMA node, or its own share of it.

Where the host binds, a step runs as fast as the rank's Python thread does. Ranks left free
on one node share its cores with each other's helper threads (autograd's device thread,
NCCL's), and the scheduler moves them between cores; `share` gives each rank whole cores of
its own (a core's hyperthreads stay together), so no two ranks meet on one core.

`PIPECAST_CPU_BIND` picks the policy for the runtime's ranks: `node` (the GPU's NUMA node,
the default), `rank` (the rank's share of that node), `rank:N` (the first N cores of that
share) or `off` (what the process was given).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from pipecast.errors import ConfigError

ENV = "PIPECAST_CPU_BIND"
POLICIES = ("node", "rank", "off")


def policy() -> tuple[str, int]:
    """(`node`, `rank` or `off`; the most cores a rank takes, 0 for its whole share)."""
    value = os.environ.get(ENV, "node").strip().lower() or "node"
    mode, _, count = value.partition(":")
    if mode not in POLICIES or (count and (mode != "rank" or not count.isdigit())):
        raise ConfigError(f"{ENV}={value!r}: use node, rank, rank:N (N cores a rank) or off")
    return mode, int(count or 0)


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def cores(cpus: Iterable[int], root: str = "/sys/devices/system/cpu") -> list[frozenset[int]]:
    """`cpus` grouped by physical core (hyperthreads together), in order of their lowest
    CPU; a CPU whose siblings can't be read is a core of its own."""
    wanted = set(cpus)
    groups: dict[int, set[int]] = {}
    for cpu in sorted(wanted):
        try:
            with open(f"{root}/cpu{cpu}/topology/thread_siblings_list") as f:
                siblings = parse_cpulist(f.read()) & wanted
        except (OSError, ValueError):
            siblings = {cpu}
        groups.setdefault(min(siblings | {cpu}), set()).update(siblings | {cpu})
    return [frozenset(g) for _, g in sorted(groups.items())]


def share(groups: list[frozenset[int]], parts: int, index: int, limit: int = 0) -> set[int]:
    """Part `index` of `parts` near-equal runs of whole cores (the first parts get one more
    where they don't divide), its first `limit` cores where that is above 0; every core when
    there are fewer cores than parts."""
    if parts < 1 or not 0 <= index < parts:
        raise ConfigError(f"CPU share {index} of {parts} does not exist")
    if len(groups) < parts:
        return set().union(*groups) if groups else set()
    size, extra = divmod(len(groups), parts)
    start = index * size + min(index, extra)
    chosen = groups[start : start + size + (index < extra)]
    return set().union(*(chosen[:limit] if limit > 0 else chosen))
