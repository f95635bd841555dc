"""How fast this process's host runs right now: seconds of a fixed pure-Python loop.

Where the host binds, a step takes as long as the host needs to issue it, and on shared or
virtual machines the host's speed moves: the same loop timed seconds apart on one 2 x H200
machine took 7.5 ms and 16.4 ms (benchmarks/results/h200x2-host). The profiler records it
beside its host times and the bench beside every measured step, so a host-bound miss can be
told apart from a host that ran slower than when it was profiled.
"""

from __future__ import annotations

import statistics
import time

ITERATIONS = 200_000


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
