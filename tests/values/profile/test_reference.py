from __future__ import annotations

import pytest

from pipecast.values.hardware.presets import gpu_kind
from pipecast.values.models.workload import Workload
from pipecast.values.profile.reference import SOURCES, carries, reference_profile, shipped


def test_gpu_kind_reads_the_device_name() -> None:
    assert gpu_kind("NVIDIA H100 80GB HBM3") == "h100" and gpu_kind("NVIDIA H200") == "h200"
    assert gpu_kind("cpu") is None and gpu_kind("NVIDIA A100-SXM4-80GB") is None


def test_a_profile_carries_to_its_own_device_only() -> None:
    assert carries("cpu", "cpu") and carries("cpu", "described")
    assert carries("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3")  # one GPU kind
    assert not carries("cpu", "NVIDIA H100 80GB HBM3")
    assert not carries("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    assert not carries("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_every_shipped_profile_was_measured_on_its_gpu(kind: str) -> None:
    profiles = shipped(kind)
    assert len(profiles) == 7
    for p in profiles:
        assert gpu_kind(p.device) == kind and p.dtype == "bf16" and p.host.windows > 1
        assert p.host.pooled > 1  # host costs pooled over several runs' profiles
        # every block priced at every size it was measured at
        assert all(set(b.costs) == set(p.micro_batch_sizes) for b in p.blocks)


def test_reference_profile_matches_workload_dtype_and_gpu() -> None:
    vgg = Workload(model="vgg16", dataset="imagenet")
    h100 = reference_profile(vgg, "bf16", "NVIDIA H100 80GB HBM3")
    h200 = reference_profile(vgg, "bf16", "NVIDIA H200")
    assert h100 is not None and "H100" in h100.device and h100.model == "vgg16"
    assert h200 is not None and "H200" in h200.device
    assert reference_profile(Workload(model="vgg16", dataset="cifar10"), "bf16", "H100") is not None
    assert reference_profile(vgg, "fp32", "NVIDIA H100 80GB HBM3") is None
    assert reference_profile(Workload(model="lenet5", dataset="mnist"), "bf16", "H100") is None
    assert reference_profile(vgg, "bf16", "NVIDIA A100-SXM4-80GB") is None
