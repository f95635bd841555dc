"""How many intra-op threads each CPU rank of a suite computes with.

[Note: one device, one share of the cores] The launcher gives a world of n CPU ranks
cores // n threads each, so on 2 cores a suite's one-rank rows computed with 2 threads and
its two-rank rows with 1 each, while the profile behind the predictions was taken with
torch's own count. The rows then compared a 2-thread "device" with 1-thread ones, and on a
machine whose cores are shared a second thread waits for a core at every parallel region,
and a small model's step on 2 threads can take many times its step on 1 (docs/decisions.md,
"Threads of a CPU rank").
Every rank of a CPU suite (and the profile its predictions come from) takes the widest
world's share instead, so that "one device" is the same share of the machine in every row.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from pipecast.orchestration.bench.config import BenchConfig


def rank_threads(configs: Iterable[BenchConfig]) -> int | None:
    """Threads for every CPU rank of these configurations: the cores over the widest CPU
    world among them, at least 1 (None: no configuration runs on CPU)."""
    widest = max((c.gpus for c in configs if c.device == "cpu"), default=0)
    if not widest:
        return None
    return max(1, (os.cpu_count() or 1) // widest)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """This process computes with `threads` intra-op threads inside the block (None: as it
    was), and with its own count again after it."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
