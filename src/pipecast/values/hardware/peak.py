"""The rate MFU is reckoned against: one GPU's dense bf16 matrix rate, as measured.

[Note: which peak]
MFU here divides by the bf16 rate a large matrix product reaches on the GPU (the probe's
8192^3 product, Cluster.matmul_flops), not by the datasheet's (DATASHEET_BF16_DENSE): on
the H100 SXMs at hand the measured rate is about a fifth below the datasheet's, so the same
run reads about 1.25x higher here. A probe of the cluster gives its own reading; a cluster
without one (described by hand, or a file without the figure) takes its GPU's preset (the
median of the probes of lent machines). Published MFUs (Megatron-LM, PaLM, NeMo) divide by
the datasheet's figure: TFLOP/s per GPU compares with them directly (docs/flops.md). CPU
ranks get no MFU: a rank's peak depends on its share of the cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import PRESETS, gpu_kind

DATASHEET_BF16_DENSE = {"h100": 989e12, "h200": 989e12}
"""FLOP/s of dense bf16 tensor-core products by NVIDIA's datasheets for the SXM parts
(H100 SXM5: 989 TFLOP/s, 1,979 with 2:4 sparsity; the H200 has the same compute). For
comparison with published MFUs only: MFU itself divides by the measured rate."""


@dataclass(frozen=True, kw_only=True)
class PeakRate:
    """One GPU's dense bf16 matrix rate and where it was read."""

    flops: float
    """FLOP/s."""
    source: Literal["probe", "preset"]
    """Read by the probe of the cluster planned for, or a preset's median of probes."""
    name: str
    """The cluster's or the preset's name."""

    def describe(self) -> str:
        """'789 TFLOP/s, the h100-nvlink preset's measured bf16 rate' (or 'the probe's')."""
        whose = f"the {self.name} preset's" if self.source == "preset" else "the probe's"
        return f"{self.flops / 1e12:,.0f} TFLOP/s, {whose} measured bf16 rate"


def peak_rate(cluster: Cluster, device: str = "") -> PeakRate | None:
    """The rate MFU divides by for `cluster`'s GPUs: its own measured one, else the preset
    of its GPU kind (named by the cluster or, for a described cluster, by `device`, the
    profile's); None for CPU ranks and for GPUs without a preset."""
    if cluster.device == "cpu":
        return None
    if cluster.matmul_flops > 0:
        preset = PRESETS.get(cluster.name)
        if preset is not None and preset.matmul_flops == cluster.matmul_flops:
            return PeakRate(flops=cluster.matmul_flops, source="preset", name=cluster.name)
        return PeakRate(flops=cluster.matmul_flops, source="probe", name=cluster.name)
    kind = gpu_kind(cluster.device) or gpu_kind(device)
    if kind is None:
        return None
    name = f"{kind}-nvlink"
    return PeakRate(flops=PRESETS[name].matmul_flops, source="preset", name=name)
