"""What a suite's predictions come from, taken in the launch that measures it: a profile of
each workload it predicts and, on CPU ranks, a probe of those ranks, all under the threads
per rank the suite's rows run with (bench.threads).

A prediction compares like with like only where its inputs were read as the rows run: a
profile taken with torch's own thread count, or a preset cluster's links, price another
machine than the one measured. Each prediction names its inputs (`Basis`), and the report
says which device, profile and cluster its accuracy figures cover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pipecast.measuring.probe import host_probe
from pipecast.measuring.probe.probe import ProbeOptions, probe
from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.orchestration.bench import sharing
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import unpredicted
from pipecast.orchestration.bench.threads import rank_threads, torch_threads
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.load import default_cluster, load_cluster
from pipecast.values.profile.types import Profile

PROBE_BYTES = 4 * 2**20
"""The largest message a CPU suite's probe times: the quick suite's stages send at most a
few hundred KiB, and gloo's time per byte is flat well before this."""
WARMUP, REPEATS = 2, 5
"""The profile's warm-up runs and timed repeats per block and size."""


@dataclass(frozen=True)
class Basis:
    """Where a suite's predictions come from."""

    device: str
    """The card the profile was taken on (environment's wording)."""
    threads: int | None
    """Intra-op threads per CPU rank, the profile's and the runs' (None: not a CPU suite)."""
    profiles: dict[str, Profile]
    """Workload key -> its profile, taken in this launch."""
    cluster: Cluster
    cluster_source: str
    """How the cluster was read: 'probed in this launch: ...', a file, or a preset."""
    waited: dict[str, float] = field(default_factory=dict)
    """Workload key -> the share of its profiling time the profiler waited for a core
    (bench.sharing; missing: not read)."""

    def describe(self, workload_key: str) -> dict[str, Any]:
        """What a prediction of `workload_key` records of its inputs."""
        p = self.profiles[workload_key]
        sizes = ",".join(map(str, p.micro_batch_sizes))
        threads = f", {self.threads} thread(s)" if self.threads else ""
        shared = (
            f"; {n} ranks computing at once {f:.2f}x as slow"
            for n, f in sorted(p.shared_compute.items())
        )
        wait = self.waited.get(workload_key)
        return {
            **({} if wait is None else {"waited": wait}),
            "device": self.device,
            "profile": f"{p.model}/{p.dataset} {p.dtype} on {p.device}{threads}, micro-batches "
            f"{sizes}, {WARMUP} warm-up + {REPEATS} repeats, taken in this launch"
            + "".join(shared),
            "cluster": self.cluster_source,
        }


Progress = Callable[[str], None]


def _workloads(configs: list[BenchConfig]) -> dict[str, tuple[BenchConfig, set[int]]]:
    """Workload key -> (a configuration of it, the micro-batch sizes its predicted
    configurations run), for workloads with at least one configuration to predict."""
    out: dict[str, tuple[BenchConfig, set[int]]] = {}
    for c in configs:
        if unpredicted(c) is not None:
            continue
        size = max(c.batch // (c.replicas * c.microbatches), 1)
        out.setdefault(c.workload.key, (c, set()))[1].add(size)
    return out


def profiles_for(
    configs: list[BenchConfig],
    threads: int | None,
    progress: Progress | None = None,
    waits: dict[str, float] | None = None,
) -> dict[str, Profile]:
    """A profile of each workload at the micro-batch sizes its configurations use, taken
    with `threads` intra-op threads; on CPU with how much slower the model computes in as
    many ranks as the suite's widest world (Profile.shared_compute). `waits` receives, per
    workload, the share of the profiling time this process waited for a core."""
    out: dict[str, Profile] = {}
    for key, (cfg, sizes) in _workloads(configs).items():
        if progress is not None:
            progress(f"profiling {key}")
        cpu = cfg.device == "cpu"
        options = ProfileOptions(
            micro_batch_sizes=tuple(sorted(sizes)),
            device="cpu" if cpu else "cuda",
            dtype=cfg.dtype,
            warmup=WARMUP,
            repeats=REPEATS,
        )
        with torch_threads(threads):
            start = sharing.Mark.now()
            prof = profile_model(
                cfg.workload.build(), cfg.workload.spec, options, model_name=cfg.workload.model
            )
            wait = sharing.waited_share(start, sharing.Mark.now())
            if waits is not None and wait is not None:
                waits[key] = wait
            worlds = {c.gpus for c in configs if c.workload.key == key and c.gpus > 1}
            if cpu and worlds:
                shared = host_probe.shared_compute(
                    cfg.workload, worlds, cfg.batch, dtype=cfg.dtype, progress=progress
                )
                prof = replace(prof, shared_compute=shared)
        out[key] = prof
    return out


def probe_cpu(ranks: int, progress: Progress | None = None) -> Cluster:
    """The links, all-reduce and the runtime's own host work between `ranks` CPU ranks
    (each with the launcher's cores // ranks threads: the suite's, bench.threads)."""
    if progress is not None:
        progress(f"probing {ranks} CPU ranks")
    options = ProbeOptions(devices=ranks, device="cpu", max_bytes=PROBE_BYTES)
    return probe(options).cluster


def basis_for(
    configs: list[BenchConfig], cluster_path: str | None, progress: Progress | None = None
) -> Basis | None:
    """Profiles and a cluster for the configurations to predict (None: none to predict).
    The cluster: `cluster_path` where given, else on CPU a probe of the widest world, else
    the preset for the profiled GPU."""
    from pipecast.orchestration.bench.store import environment

    wanted = _workloads(configs)
    if not wanted:
        return None
    cpu = all(cfg.device == "cpu" for cfg, _ in wanted.values())
    threads = rank_threads(configs) if cpu else None
    waits: dict[str, float] = {}
    profiles = profiles_for(configs, threads, progress, waits)
    widest = max(c.gpus for c in configs)
    first = next(iter(profiles.values()))
    if cluster_path:
        cluster, source = load_cluster(cluster_path), f"{cluster_path} (given)"
    elif cpu and widest > 1:
        cluster = probe_cpu(widest, progress)
        source = f"probed in this launch: {widest} CPU ranks, {threads} thread(s) each"
    else:
        cluster = default_cluster(first.device, max(widest, 1))
        source = f"the {cluster.name} preset (not probed)"
    device = environment("cpu" if cpu else "cuda", threads=threads)["card"]
    return Basis(str(device), threads, profiles, cluster, source, waits)
