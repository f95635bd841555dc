"""Clusters a user can name without probing, and one built from a few flags.

H100 and H200 SXM with NVLink 4: within a node, each figure the probe reads is the median over
the probes of the lent 4-GPU machines (`measured_preset`); the all-reduce over 8 GPUs, which
no probe read, and inter-node links (400 Gbit/s InfiniBand per GPU) are nominal. Those
medians predicted the stored runs about as well as each run's own probe, and better than
nominal figures (docs/decisions.md, "Presets from the probes' medians").

Nodes and clusters as built (docs/clusters.md has the sources):

- `dgx-h100`: one NVIDIA DGX H100, 8 H100 SXM5 80GB joined by NVLink 4 through 4 NVSwitches
  (900 GB/s per GPU both ways together, 450 GB/s each way) and 8 ConnectX-7 NICs of
  400 Gbit/s, one per GPU, each on a rail of its own (NVIDIA DGX H100 User Guide, "Hardware
  Overview"). Within the node it holds `h100-nvlink`'s probe medians, which predict better
  than the nominal 450 GB/s; the rails are the nominal 400 Gbit/s.
- `dgx-h200`: the same node with 8 H200 SXM 141GB (NVIDIA DGX H200 User Guide), the H200
  probes' medians within the node.
- `h100-superpod`: a DGX SuperPOD of DGX H100 (NVIDIA DGX SuperPOD Reference Architecture,
  RA-11333-001, "Network Fabrics"): scalable units of 32 nodes, each rail-aligned (GPU k of
  a node one hop from GPU k of the other 31 through rail k's leaf switch), 4 of them under
  a full fat-tree spine of NDR 400 Gbit/s InfiniBand, non-blocking: oversubscription 1. The
  reference's 4 units hold 127 nodes (one slot goes to the fabric manager); the preset counts
  128. A description {"preset": "h100-superpod", "oversubscription": 2, "nodes": 64} prices
  a spine of 2:1 or another size (load.load_cluster).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from pipecast.errors import UnknownNameError
from pipecast.values.hardware.cluster import DDP_PARAM_HOST, Cluster, Link
from pipecast.values.hardware.units import parse_bytes, parse_rate, parse_seconds

GIB = 2**30
_IB = Link(latency=5e-6, bandwidth=parse_rate("400Gbit/s"))

PRESETS: dict[str, Cluster] = {
    "h100-nvlink": Cluster(
        name="h100-nvlink",
        device="NVIDIA H100 80GB HBM3",
        gpus_per_node=8,
        memory_bytes=79 * GIB,
        matmul_flops=789e12,
        intra=Link(latency=49e-6, bandwidth=335e9),
        inter=_IB,
        allreduce_busbw={2: 282e9, 3: 312e9, 4: 317e9, 8: 360e9},
        allreduce_latency=63e-6,
        host_overhead=231e-6,
        step_overhead=1.74e-3,
        host_contention={2: 1.01, 3: 1.0, 4: 1.0},
        ddp_step_host=515e-6,
        ddp_param_host=DDP_PARAM_HOST,
        ddp_buffer_host=15.6e-6,
    ),
    "h200-nvlink": Cluster(
        name="h200-nvlink",
        device="NVIDIA H200",
        gpus_per_node=8,
        memory_bytes=140 * GIB,
        matmul_flops=789e12,
        intra=Link(latency=48e-6, bandwidth=333e9),
        inter=_IB,
        allreduce_busbw={2: 287e9, 3: 320e9, 4: 323e9, 8: 360e9},
        allreduce_latency=63e-6,
        host_overhead=243e-6,
        step_overhead=1.73e-3,
        host_contention={2: 1.04, 3: 1.13, 4: 1.05},
        ddp_step_host=569e-6,
        ddp_param_host=DDP_PARAM_HOST,
        ddp_buffer_host=10.3e-6,
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

# DGX H100 and H200: one ConnectX-7 of 400 Gbit/s (_IB) per GPU, a rail each.
PRESETS["dgx-h100"] = replace(
    PRESETS["h100-nvlink"], name="dgx-h100", device="NVIDIA H100 80GB HBM3", nics_per_gpu=1
)
PRESETS["dgx-h200"] = replace(PRESETS["h200-nvlink"], name="dgx-h200", nics_per_gpu=1)
PRESETS["h100-superpod"] = replace(
    PRESETS["dgx-h100"], name="h100-superpod", nodes=128, nodes_per_pod=32, oversubscription=1.0
)

GPU_KINDS = ("h100", "h200")
"""The GPUs with a preset of their own (`<kind>-nvlink`)."""


def gpu_kind(device_name: str) -> str | None:
    """'h100' or 'h200' for a device name that says so (torch's names, e.g. 'NVIDIA H100 80GB
    HBM3'), else None."""
    lowered = device_name.lower()
    return next((kind for kind in GPU_KINDS if kind in lowered), None)


def measured_preset(base: Cluster, probes: Sequence[Cluster]) -> Cluster:
    """`base` with every figure the probe reads set to its median over `probes` (probes of
    one machine type): the link between two GPUs, the all-reduce rate by group size (larger
    groups than measured keep base's), its latency, the matmul rate, the runtime's host cost
    per action and per step, DDP's host costs and the host contention factor by busy ranks.
    A figure no probe read keeps base's. The hosts' absolute speed (host_issue) is left out:
    a preset stands for a machine the user has not measured."""

    def median(read: Callable[[Cluster], float], default: float) -> float:
        values = [v for v in map(read, probes) if v > 0]
        return statistics.median(values) if values else default

    def by_count(
        read: Callable[[Cluster], dict[int, float]], default: dict[int, float]
    ) -> dict[int, float]:
        counts = sorted({n for p in probes for n in read(p)})
        measured = {
            n: statistics.median(read(p)[n] for p in probes if n in read(p)) for n in counts
        }
        return {**default, **measured}

    return replace(
        base,
        intra=Link(
            latency=median(lambda c: c.intra.latency, base.intra.latency),
            bandwidth=median(lambda c: c.intra.bandwidth, base.intra.bandwidth),
        ),
        allreduce_busbw=by_count(lambda c: c.allreduce_busbw, base.allreduce_busbw),
        allreduce_latency=median(lambda c: c.allreduce_latency, base.allreduce_latency),
        matmul_flops=median(lambda c: c.matmul_flops, base.matmul_flops),
        host_overhead=median(lambda c: c.host_overhead, base.host_overhead),
        step_overhead=median(lambda c: c.step_overhead, base.step_overhead),
        host_contention=by_count(lambda c: c.host_contention, base.host_contention),
        ddp_step_host=median(lambda c: c.ddp_step_host, base.ddp_step_host),
        ddp_param_host=(
            DDP_PARAM_HOST if any(p.ddp_step_host > 0 for p in probes) else base.ddp_param_host
        ),
        ddp_buffer_host=median(lambda c: c.ddp_buffer_host, base.ddp_buffer_host),
    )


def preset(name: str) -> Cluster:
    if name not in PRESETS:
        raise UnknownNameError("cluster preset", name, list(PRESETS))
    return PRESETS[name]


DESCRIBED_LINKS = {
    "intra_bandwidth": "150GB/s",
    "intra_latency": "10us",
    "inter_bandwidth": "50GB/s",
    "inter_latency": "20us",
}
"""describe's links where a user names none (`probe --describe` shows these): a link between
nodes is never faster than one inside a node, in bandwidth or in latency."""


def describe(
    *,
    gpus_per_node: int,
    memory: str,
    nodes: int = 1,
    intra_bandwidth: str = DESCRIBED_LINKS["intra_bandwidth"],
    intra_latency: str = DESCRIBED_LINKS["intra_latency"],
    inter_bandwidth: str = DESCRIBED_LINKS["inter_bandwidth"],
    inter_latency: str = DESCRIBED_LINKS["inter_latency"],
    device: str = "described",
) -> Cluster:
    """A machine you don't have, from the figures a user knows (the background recommender
    asked for intra- and inter-connect speeds the same way); links default to
    DESCRIBED_LINKS."""
    return Cluster(
        name=f"{nodes}x{gpus_per_node} {device}",
        device=device,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        memory_bytes=parse_bytes(memory),
        intra=Link(latency=parse_seconds(intra_latency), bandwidth=parse_rate(intra_bandwidth)),
        inter=Link(latency=parse_seconds(inter_latency), bandwidth=parse_rate(inter_bandwidth)),
    )
