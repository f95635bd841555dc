"""Profiles of zoo workloads measured on the GPUs pipecast is validated on, shipped with it.

A profile prices steps on the device it was measured on: a CPU's block times say nothing of
an H100's. `pipecast recommend --cluster h100-nvlink` on a machine without that GPU predicts
from these instead: for each GPU kind, one run's profiles of the zoo's workloads in bf16 (torch
2.11), with every host cost, the split-call cost, the host issue and the loop reading the
mean over that model's profiles from several runs on that kind (pipecast.values.profile.pool): one
profile's host readings catch the host in one of its spells (docs/decisions.md, "Pooled
host costs"). How well they predict without the GPUs: docs/accuracy.md.
"""

from __future__ import annotations

from pathlib import Path

from pipecast.values.hardware.presets import gpu_kind
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import Profile

REFERENCE_DIR = Path(__file__).with_name("shipped")
"""<kind>/<workload key>.json"""

SOURCES = {"h100": "h100x4-run18", "h200": "h200x4-run14"}
"""The stored run each GPU kind's profiles come from (their host costs aside)."""

UNNAMED = ("", "described")
"""Cluster.device of a cluster described by its links alone (hardware.presets.describe)."""


def carries(profiled_on: str, cluster_device: str) -> bool:
    """Whether a profile measured on `profiled_on` (devices.name: 'cpu' or the GPU's name)
    prices steps on a cluster of `cluster_device`: the same device, or a cluster that names
    none (described by its links alone)."""
    if cluster_device in UNNAMED or cluster_device == profiled_on:
        return True
    kind = gpu_kind(cluster_device)
    return kind is not None and kind == gpu_kind(profiled_on)


def shipped(kind: str) -> list[Profile]:
    """Every reference profile of a GPU kind, in name order (none for an unknown kind)."""
    return [Profile.load(str(p)) for p in sorted((REFERENCE_DIR / kind).glob("*.json"))]


def label(profile: Profile) -> str:
    return f"{Workload.from_dict(profile.workload).key} {profile.dtype}"


def reference_profile(workload: Workload, dtype: str, device_name: str) -> Profile | None:
    """The shipped profile of `workload` in `dtype` (no autocast) on the GPU kind that
    `device_name` names, if there is one."""
    kind = gpu_kind(device_name)
    if kind is None:
        return None
    path = REFERENCE_DIR / kind / f"{workload.key}.json"
    if not path.exists():
        return None
    profile = Profile.load(str(path))
    return profile if profile.dtype == dtype and not profile.autocast else None
