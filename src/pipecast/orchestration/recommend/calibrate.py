"""Calibration: the first recommendation on a machine measures what it needs (a profile at
the micro-batch sizes the strategies use, and the links) and caches it; later runs for the
same model and machine read the cache and take seconds. On GPUs, each profile measured is
also kept in a history beside the cache, and the cached one carries host costs pooled over
the newest HISTORY of them (pipecast.values.profile.pool): a recalibration adds a reading of the
host rather than replacing the last."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from pipecast.errors import DataError
from pipecast.measuring.probe import host_probe
from pipecast.measuring.probe.probe import ProbeOptions, probe
from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.runtime import devices
from pipecast.values.hardware.cluster import CPU_PROBE_RANKS, Cluster
from pipecast.values.models.sources import file_stem
from pipecast.values.models.tensor_plans import why_not_split
from pipecast.values.models.workload import Workload
from pipecast.values.profile.pool import pool_host, poolable
from pipecast.values.profile.types import Dtype, Profile
from pipecast.values.training import Compile

HISTORY = 8
"""How many of a model's newest profiles on one machine the cached profile's host costs are
the mean of."""


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


def tensor_parallel_degrees(workload: Workload, gpus: int) -> tuple[int, ...]:
    """The tensor-parallel degrees worth profiling the model at for `gpus` GPUs: 2, 4, ...
    up to them, those a plan can split its blocks by (none for a model without one)."""
    blocks = list(workload.build("meta"))
    degrees, t = [], 2
    while t <= gpus:
        if why_not_split(blocks, t) is None:
            degrees.append(t)
        t *= 2
    return tuple(degrees)


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
    pool: bool | None = None,
    execution: tuple[Compile, bool, bool] = ("off", False, False),
) -> tuple[Profile, bool]:
    """The cached profile for this workload and device, measuring what is missing (and,
    with `refresh`, measuring it again). Returns (profile, came_from_cache). With `pool`
    (default: on GPUs), a profile measured here takes host costs pooled over it and the
    earlier ones in its history (pooled_with_history). On a CPU with `ranks` of 2 or more,
    the profile also holds how much slower the model computes in n ranks sharing the cores
    (n: sharing_counts), each at `batch` // n samples (Profile.shared_compute). `execution`:
    the blocks compiled, channels-last, in Float8 (Profile.execution), each its own profile
    (tensor-parallel readings only in the plain one)."""
    dev = devices.resolve(device)
    compile_, channels_last, in_float8 = execution
    name = devices.name(dev)
    split = tensor_parallel_degrees(workload, ranks) if dev.type == "cuda" else ()
    options = ProfileOptions(
        micro_batch_sizes=sizes,
        device=device,
        dtype=dtype,
        autocast=autocast,
        warmup=2,
        repeats=5,
        tensor_parallel=split if execution == ("off", False, False) else (),
        compile=compile_,
        channels_last=channels_last,
        float8=in_float8,
    )
    # profiles cached before device times were taken with the issuing hidden are re-taken
    hidden = f"hide_issue={options.hide_issue}"
    # and on GPUs, those cached before the profiler timed graph replays and measured each
    # block's library workspaces
    graphed = f"graph_times={options.graph_times}|kept_workspace" if dev.type == "cuda" else ""
    shared = ranks > 1 and dev.type == "cpu"
    sharing = f"shared={ranks},{batch}" if shared else ""
    key = _key(
        workload.key,
        name,
        dtype,
        autocast,
        torch.__version__,
        sizes,
        hidden,
        graphed,
        sharing,
        split,
        *(("execution", *execution) if execution != ("off", False, False) else ()),
    )
    path = cache_dir() / f"profile-{file_stem(workload.model)}-{key}.json"
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
    if (dev.type == "cuda") if pool is None else pool:
        profile = pooled_with_history(path, profile)
    profile.save(str(path))
    return profile, False


def pooled_with_history(path: Path, profile: Profile) -> Profile:
    """Keep `profile` (just measured) in the history folder beside the cached file `path`
    and return it with host costs the mean over the newest HISTORY profiles there that
    match it (a profile cached before histories were kept joins the history first; files
    that do not load or match are passed over; readings older than those pooled are
    deleted)."""
    history = path.with_suffix(".history")
    history.mkdir(exist_ok=True)
    if path.exists() and not any(history.glob("*.json")):
        try:
            earlier = Profile.load(str(path))
        except DataError:
            earlier = None
        if earlier is not None and earlier.host.pooled == 1:
            earlier.save(str(history / "0.json"))
    newest = history / f"{time.time_ns()}.json"
    profile.save(str(newest))
    readings = [profile]  # as saved: no need to read it back
    files = [f for f in history.glob("*.json") if f.stem.isdigit() and f != newest]
    for f in sorted(files, key=lambda f: int(f.stem), reverse=True):
        if len(readings) == HISTORY:
            f.unlink()  # older than every reading pooled: the history keeps HISTORY
            continue
        try:
            p = Profile.load(str(f))
        except DataError:
            continue
        if p.host.pooled == 1 and not poolable(profile, p):
            readings.append(p)
    return pool_host(profile, readings) if len(readings) > 1 else profile


def calibrated_cluster(gpus: int, device: str, refresh: bool = False) -> tuple[Cluster, bool]:
    """The cached probe of `gpus` devices of this machine (measured on first use, and again
    with `refresh`)."""
    dev = "cuda" if device.startswith("cuda") else "cpu"
    name = devices.name(devices.resolve(device))
    # probes taken before they read the runtime's own work per action on CPU, before DDP's
    # cost per parameter tensor was fixed on GPUs, or before they timed the host's Adam
    # fused and per dtype, are re-taken
    probed_with = ("runtime_overhead" if dev == "cpu" else "ddp_param_fixed") + "-fused-adam"
    path = cache_dir() / f"cluster-{_key(name, gpus, dev, torch.__version__, probed_with)}.json"
    if path.exists() and not refresh:
        return _host_shared(Cluster.load(str(path)), gpus), True
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
    return _host_shared(cluster, gpus), False


def _host_shared(cluster: Cluster, ranks: int) -> Cluster:
    """A cluster of CPU ranks with each rank's share of the host's memory (a CPU rank has
    none of its own: counted whole, every rank was offered all of it), read from the host
    as it is now, so that a cached probe taken before the share was kept gets it too."""
    if cluster.device != "cpu":
        return cluster
    host = devices.total_memory(torch.device("cpu"))
    return replace(cluster, memory_bytes=host // ranks) if host else cluster
