"""recommend's branch and bound (planning.recommend.search) against pricing every strategy.

The reference is the exhaustive loop itself (recommend without `keep`): the bounded search
must rank the same strategies in the same order down to the keep-th best, with the same
reason and close calls, while leaving some unpriced; and the bound it orders them by must be
no more than any strategy's predicted step (planning.recommend.bound).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile
from tests.values.profile.helpers import shipped_profile

from pipecast.planning.recommend.bound import Bounds
from pipecast.planning.recommend.rank import Recommendation, recommend
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import describe, preset
from pipecast.values.profile.types import Profile

KEEP = 5


def _tensor_parallel() -> Profile:
    """Six uneven blocks of 3 GB of weights, split over 2 or 4 tensor-parallel ranks."""
    fwd = [2e-3, 5e-3, 4e-3, 6e-3, 3e-3, 8e-3]
    p = make_profile(fwd, params=[3_000_000_000] * 6, out_bytes=[4_000_000] * 6)
    p = replace(p, device="NVIDIA H100 80GB HBM3", dtype="bf16")
    split = {
        t: tuple(
            replace(
                b,
                param_bytes=b.param_bytes // t,
                costs={s: replace(c, forward=c.forward / t) for s, c in b.costs.items()},
            )
            for b in p.blocks
        )
        for t in (2, 4)
    }
    return replace(p, tensor_parallel=split)


CASES = {
    # a GPU profile: graphed strategies, offloaded forms of what does not fit
    "resnet18 on 4 H100s": (shipped_profile("resnet18"), preset("h100-nvlink"), 256, 4, {}),
    # tensor parallelism, FSDP, pipelines over two nodes, Adam's state
    "tensor parallel on 2 nodes": (
        _tensor_parallel(),
        describe(gpus_per_node=4, nodes=2, memory="24GiB"),
        16,
        8,
        {"optimizer": "adam"},
    ),
}


@functools.cache
def _both(name: str) -> tuple[Recommendation, Recommendation, Profile, Cluster, int]:
    profile, cluster, batch, gpus, kw = CASES[name]
    full = recommend(profile, cluster, batch, gpus=gpus, **kw)
    fast = recommend(profile, cluster, batch, gpus=gpus, keep=KEEP, **kw)
    return full, fast, profile, cluster, batch


@pytest.mark.parametrize("name", CASES)
def test_the_bounded_search_ranks_as_pricing_every_strategy(name: str) -> None:
    full, fast, *_ = _both(name)
    every = [(p.strategy, p.step_time) for p in full.ranked]
    some = [(p.strategy, p.step_time) for p in fast.ranked]
    cut = some[KEEP - 1][1]
    head = [x for x in every if x[1] <= cut]
    assert len(head) >= KEEP
    assert some[: len(head)] == head  # the same strategies, steps and order to the cut
    assert set(some) <= set(every)  # whatever else it priced, priced as the full search
    assert fast.reason() == full.reason()  # the best of each family, the close calls
    assert [p.strategy for p in fast.close_calls()] == [p.strategy for p in full.close_calls()]
    assert fast.skipped > 0 and fast.kept == KEEP  # and some were left unpriced, counted
    # what a lower bound on its memory shows cannot fit is rejected unpriced, and says so
    assert all(r.need == 0 for r in fast.rejected if "a lower bound" in r.reason)
    assert full.skipped == 0


@pytest.mark.parametrize("name", CASES)
def test_the_bound_is_below_every_predicted_step(name: str) -> None:
    full, _, profile, cluster, batch = _both(name)
    bounds = Bounds(cluster, batch)
    below = [bounds.step(profile, p.strategy) / p.step_time for p in full.ranked]
    assert max(below) <= 1 + 1e-9
    covered = [b for p, b in zip(full.ranked, below, strict=True) if p.strategy.offload == "none"]
    assert min(covered) > 0 and max(covered) > 0.9  # not trivial: near where compute binds


@pytest.mark.parametrize("name", CASES)
def test_the_memory_bound_is_below_every_predicted_peak(name: str) -> None:
    full, _, profile, cluster, batch = _both(name)
    optimizer = CASES[name][4].get("optimizer", "sgd")
    bounds = Bounds(cluster, batch)
    peaks = [(p.strategy, p.peak_memory) for p in full.ranked]
    peaks += [(r.strategy, r.need) for r in full.rejected if r.need]
    below = [bounds.memory(profile, s, optimizer) / peak for s, peak in peaks]
    assert max(below) <= 1
    assert min(b for (s, _), b in zip(peaks, below, strict=True) if s.offload == "none") > 0
