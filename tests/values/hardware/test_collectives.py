"""All-gather and reduce-scatter: what the probe fits from its samples, and the times a
cluster gives them (the collectives FSDP runs per unit of blocks)."""

from __future__ import annotations

import pytest

from pipecast.measuring.probe.probe import summarize_probe
from pipecast.values.hardware.presets import describe

SIZES = [4096 * 4**k for k in range(6)]


def _timed(latency: float, busbw: float, ring: float, n: int) -> list[list[float]]:
    """Samples of a collective over `n` ranks moving ring x (n-1)/n of each size."""
    return [[s, latency + ring * (n - 1) / n * s / busbw] for s in SIZES]


def test_the_probe_fits_each_collectives_own_bus_bandwidth() -> None:
    """Four ranks: an all-reduce at 200 GB/s bus bandwidth, an all-gather at 150, a
    reduce-scatter at 120, each fitted from its own samples with its own ring factor."""
    rank = {
        "p2p": {},
        "allreduce": {"4": _timed(3e-5, 200e9, 2.0, 4)},
        "allgather": {"4": _timed(1e-5, 150e9, 1.0, 4)},
        "reduce_scatter": {"4": _timed(2e-5, 120e9, 1.0, 4)},
        "matmul_flops": 1e14,
        "memory": 2**34,
        "name": "gpu",
    }
    others = {"p2p": {}, "allreduce": {}, "matmul_flops": 1e14, "memory": 2**34, "name": "gpu"}
    c = summarize_probe([rank, others, others, others]).cluster
    assert c.allreduce_busbw[4] == pytest.approx(200e9, rel=1e-6)
    assert c.allgather_busbw[4] == pytest.approx(150e9, rel=1e-6)
    assert c.reduce_scatter_busbw[4] == pytest.approx(120e9, rel=1e-6)
    assert c.shard_latency == pytest.approx(2e-5, rel=1e-3)
    # a gathered gigabyte over the four: 3/4 of it crosses each link once
    assert c.allgather_time(1e9, range(4)) == pytest.approx(2e-5 + 0.75 * 1e9 / 150e9)
    assert c.reduce_scatter_time(1e9, range(4)) == pytest.approx(2e-5 + 0.75 * 1e9 / 120e9)


def test_unmeasured_sharded_collectives_take_half_an_all_reduce() -> None:
    """A ring all-reduce is a reduce-scatter then an all-gather: where neither was measured,
    each is assumed to take half the all-reduce's time; one rank moves nothing."""
    c = describe(gpus_per_node=4, memory="80GiB")
    assert c.allgather_time(1e9, range(4)) == pytest.approx(c.allreduce_time(1e9, range(4)) / 2)
    assert c.reduce_scatter_time(1e9, range(2)) == pytest.approx(
        c.allreduce_time(1e9, range(2)) / 2
    )
    assert c.allgather_time(1e9, [3]) == 0.0
