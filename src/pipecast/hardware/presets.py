"""Clusters a user can name without probing, and one built from a few flags.

Figures: H100/H200 SXM with NVLink 4 (the device machines' probe results, committed under
benchmarks/results, replace these where measured); inter-node 400 Gbit/s InfiniBand per GPU.
"""

from __future__ import annotations

from pipecast.errors import UnknownNameError
from pipecast.hardware.cluster import Cluster, Link
from pipecast.hardware.units import parse_bytes, parse_rate, parse_seconds

GIB = 2**30
_IB = Link(latency=5e-6, bandwidth=parse_rate("400Gbit/s"))

PRESETS: dict[str, Cluster] = {
    "h100-nvlink": Cluster(
        name="h100-nvlink",
        device="NVIDIA H100 80GB HBM3",
        gpus_per_node=8,
        memory_bytes=79 * GIB,
        matmul_flops=780e12,
        intra=Link(latency=1e-5, bandwidth=150e9),
        inter=_IB,
        allreduce_busbw={2: 330e9, 4: 355e9, 8: 360e9},
    ),
    "h200-nvlink": Cluster(
        name="h200-nvlink",
        device="NVIDIA H200",
        gpus_per_node=8,
        memory_bytes=140 * GIB,
        matmul_flops=790e12,
        intra=Link(latency=1e-5, bandwidth=150e9),
        inter=_IB,
        allreduce_busbw={2: 330e9, 4: 355e9, 8: 360e9},
    ),
    "cpu": Cluster(
        name="cpu",
        device="cpu",
        gpus_per_node=4,
        memory_bytes=8 * GIB,
        intra=Link(latency=5e-5, bandwidth=2e9),
        inter=Link(latency=5e-5, bandwidth=2e9),
    ),
}


def preset(name: str) -> Cluster:
    if name not in PRESETS:
        raise UnknownNameError("cluster preset", name, list(PRESETS))
    return PRESETS[name]


def describe(
    *,
    gpus_per_node: int,
    memory: str,
    nodes: int = 1,
    intra_bandwidth: str = "150GB/s",
    intra_latency: str = "10us",
    inter_bandwidth: str = "50GB/s",
    inter_latency: str = "5us",
    device: str = "described",
) -> Cluster:
    """A machine you don't have, from the figures a user knows (the background recommender
    asked for intra- and inter-connect speeds the same way)."""
    return Cluster(
        name=f"{nodes}x{gpus_per_node} {device}",
        device=device,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        memory_bytes=parse_bytes(memory),
        intra=Link(latency=parse_seconds(intra_latency), bandwidth=parse_rate(intra_bandwidth)),
        inter=Link(latency=parse_seconds(inter_latency), bandwidth=parse_rate(inter_bandwidth)),
    )
