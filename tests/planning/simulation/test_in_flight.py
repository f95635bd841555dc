"""Transfer buffers a rank holds until NCCL is done with them (memory.RankMemory): the bytes
counted at each issue are those of the transfers still running then, as a list filtered at
every issue counts them."""

from __future__ import annotations

import random

from pipecast.planning.simulation.memory import RankMemory


def test_the_heap_holds_what_a_filtered_list_holds() -> None:
    rng = random.Random(0)
    for _ in range(50):
        mem, naive = RankMemory(), []  # naive: (bytes, done), filtered at every issue
        for _ in range(200):
            issue = rng.uniform(0, 100)
            if rng.random() < 0.5:
                size, done = rng.randrange(1, 10**6), rng.uniform(0, 120)
                mem._hold(size, done)
                naive.append((size, done))
                continue
            naive = [(b, t) for b, t in naive if t > issue]
            mem._drop_done(issue)
            assert mem.in_flight_bytes == sum(b for b, _ in naive)
