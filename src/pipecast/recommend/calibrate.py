"""Calibration: the first recommendation on a machine measures what it needs (a profile at
the micro-batch sizes the strategies use, and the links) and caches it; later runs for the
same model and machine read the cache and take seconds."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from pipecast import devices
from pipecast.hardware import host_probe
from pipecast.hardware.cluster import CPU_PROBE_RANKS, Cluster
from pipecast.hardware.probe import ProbeOptions, probe
from pipecast.models.workload import Workload
from pipecast.profile.profiler import ProfileOptions, profile_model
from pipecast.profile.types import Dtype, Profile


def cache_dir() -> Path:
    root = os.environ.get("PIPECAST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pipecast"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def profile_sizes(batch: int, gpus: int) -> tuple[int, ...]:
    """Powers of two from the smallest micro-batch any strategy uses to the largest."""
    smallest = max(1, batch // (gpus * 64))
    sizes, s = [], 1
    while s <= batch:
        if s >= smallest // 2:
            sizes.append(s)
        s *= 2
    return tuple(sizes)


def sharing_counts(ranks: int) -> tuple[int, ...]:
    """Rank counts to time the model in at once: each from 2 to 4, then powers of two and
    `ranks` itself (counts between take the nearest below)."""
    counts = set(range(2, min(ranks, 4) + 1))
    n = 8
    while n < ranks:
        counts.add(n)
        n *= 2
    if ranks >= 2:
        counts.add(ranks)
    return tuple(sorted(counts))


def _key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:16]


def calibrated_profile(
    workload: Workload,
    sizes: tuple[int, ...],
    *,
    device: str,
    dtype: Dtype,
    autocast: bool,
    progress: Callable[[str], None] | None = None,
    refresh: bool = False,
    ranks: int = 1,
    batch: int = 0,
) -> tuple[Profile, bool]:
    """The cached profile for this workload and device, measuring what is missing (and,
    with `refresh`, measuring it again in its place). Returns (profile, came_from_cache).
    On a CPU with `ranks` of 2 or more, the profile also holds how much slower the model
    computes in n ranks sharing the cores (n: sharing_counts), each at `batch` // n samples
    (Profile.shared_compute)."""
    dev = devices.resolve(device)
    name = devices.name(dev)
    options = ProfileOptions(
        micro_batches=sizes, device=device, dtype=dtype, autocast=autocast, warmup=2, repeats=5
    )
    # profiles cached before device times were taken with the issuing hidden are re-taken
    hidden = f"hide_issue={options.hide_issue}"
    # and on GPUs, those cached before the profiler timed graph replays and measured each
    # block's library workspaces
    graphed = f"graph_times={options.graph_times}|kept_workspace" if dev.type == "cuda" else ""
    shared = ranks > 1 and dev.type == "cpu"
    sharing = f"shared={ranks},{batch}" if shared else ""
    key = _key(
        workload.key, name, dtype, autocast, torch.__version__, sizes, hidden, graphed, sharing
    )
    path = cache_dir() / f"profile-{workload.model.replace(':', '_')}-{key}.json"
    if path.exists() and not refresh:
        return Profile.load(str(path)), True
    profile = profile_model(
        workload.build(),
        workload.spec,
        options,
        model_name=workload.model,
        workload=workload.to_dict(),
        progress=progress,
    )
    if shared:
        factors = host_probe.shared_compute(
            workload, sharing_counts(ranks), batch or max(sizes), dtype=dtype, progress=progress
        )
        profile = replace(profile, shared_compute=factors)
    profile.save(str(path))
    return profile, False


def calibrated_cluster(gpus: int, device: str, refresh: bool = False) -> tuple[Cluster, bool]:
    """The cached probe of `gpus` devices of this machine (measured on first use, and again
    with `refresh`)."""
    dev = "cuda" if device.startswith("cuda") else "cpu"
    name = devices.name(devices.resolve(device))
    # probes taken before they read the runtime's own work per action on CPU, or before
    # DDP's cost per parameter tensor was fixed on GPUs, are re-taken
    probed_with = "runtime_overhead" if dev == "cpu" else "ddp_param_fixed"
    path = cache_dir() / f"cluster-{_key(name, gpus, dev, torch.__version__, probed_with)}.json"
    if path.exists() and not refresh:
        return Cluster.load(str(path)), True
    count = gpus if dev == "cuda" else CPU_PROBE_RANKS
    result = probe(
        ProbeOptions(
            devices=count,
            device=dev,
            max_bytes=64 * 2**20,
            repeats=3,
            matmul_size=0 if dev == "cuda" else 512,
        )
    )
    cluster = result.cluster
    if dev == "cpu" and gpus > count:
        cluster = replace(cluster, gpus_per_node=gpus, pairs={})  # the CPU link, for more ranks
    if dev == "cpu":  # ranks share the cores the profile had to itself
        cluster = replace(cluster, cpu_compute=host_probe.cpu_compute(range(1, gpus + 1)))
    cluster.save(str(path))
    return cluster, False
