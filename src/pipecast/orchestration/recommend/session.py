"""A recommendation end to end: defaults, calibration, ranking, validation, the JSON it writes.

`recommend_for(request)` is what `pipecast recommend` and `pipecast.recommend` run: it fills
in what the request leaves open (the model, batch, precision and GPUs a user of this machine
most likely means), finds a profile and a cluster (cached, measured, given, or shipped for
GPUs this machine does not have), ranks every strategy and, if asked, measures the close
calls. What it does as it goes reaches the caller through `Events`, so the CLI can draw
progress without this module printing anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pipecast import jsonio
from pipecast.errors import ConfigError
from pipecast.measuring import hostspeed
from pipecast.orchestration.recommend.sources import (
    Source,
    cluster_for,
    profile_for,
    variants_for,
)
from pipecast.orchestration.recommend.validate import (
    Measured,
    decide,
    measure_candidates,
    why,
)
from pipecast.planning.recommend.host_drift import HostDrift, host_drift
from pipecast.planning.recommend.predict import Prediction
from pipecast.planning.recommend.rank import Recommendation, recommend
from pipecast.runtime import devices
from pipecast.runtime.config import RunConfig
from pipecast.values.data.registry import epoch_samples
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import PRESETS
from pipecast.values.models.workload import Workload
from pipecast.values.profile.flops import counted
from pipecast.values.profile.reference import UNNAMED, carries, reference_profile
from pipecast.values.profile.types import Profile
from pipecast.values.training import Compile, Optimizer

MAX_CPU_RANKS = 64
"""The most CPU ranks the calibration probes and profiles (each a process)."""

NO_GPU_PRESET = "h100-nvlink"
"""What a machine without GPUs plans for when nobody names a cluster: an 8-GPU H100 node,
predicted from the profiles pipecast ships (a CPU's block times say nothing of a GPU's)."""


@dataclass(frozen=True, kw_only=True)
class Request:
    """What to recommend for. Fields left None take the defaults `with_defaults` gives."""

    workload: Workload | None = None
    batch: int = 0
    """Global batch per step (0: 256 on GPUs, 32 on CPU ranks)."""
    gpus: int = 0
    """GPUs to plan for (0: every one here, the cluster's, or 4 CPU ranks)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """Where to profile and validate (auto: cuda if present)."""
    dtype: Literal["fp32", "bf16", "fp16"] | None = None
    autocast: bool = False
    optimizer: Optimizer = "sgd"
    memory_margin: float = 0.1
    memory_limit: int = 0
    """Bytes per GPU to plan for instead of the cluster's own (0: the cluster's)."""
    serve: bool = False
    """Rank ways to run inference (forward only) on the batch instead of training steps."""
    methods: tuple[str, ...] = ("balanced",)
    cuda_graphs: bool | None = None
    """Predict strategies replayed as CUDA graphs (None: on GPUs, as the runtime runs them;
    False: eager)."""
    epoch_samples: int = 0
    cluster: Cluster | None = None
    """Plan for these devices instead of probing this machine."""
    profile: Profile | None = None
    """Predict from this profile instead of the cached one."""
    recalibrate: bool = False
    validate: int | Literal["auto"] = 0
    rounds: int = 2
    executions: tuple[tuple[Compile, bool, bool], ...] = ()
    """Other ways to run the blocks to rank beside eager ones (Profile.execution: compiled,
    channels-last, Float8), each profiled here (or, for --profile, taken from `variants`)."""
    variants: tuple[Profile, ...] = ()
    """Profiles of the same model run another way, given rather than measured."""
    keep: int = 0
    """Rank exactly only the `keep` fastest (with each family's fastest and the close
    calls), leaving unpriced what a lower bound shows cannot join them (0: price every
    strategy; planning.recommend.search)."""


@dataclass
class Events:
    """What the caller hears while a recommendation is made (each optional)."""

    profiling: Callable[[str], None] | None = None
    """Each block as the profiler reaches it."""
    calibrating: Callable[[str], None] | None = None
    """Before a step that takes a while: 'profiling' or 'probing'."""
    calibrated: Callable[[Profile, Source, Cluster, Source], None] | None = None
    """The profile and the cluster the predictions come from, and where each came from."""
    ranked: Callable[[Recommendation], None] | None = None
    """The ranking, before any validation."""
    validating: Callable[[int, Prediction], None] | None = None
    """Each measurement: (round, strategy)."""
    note: Callable[[str], None] | None = None
    """A line worth telling the user."""

    def say(self, text: str) -> None:
        if self.note is not None:
            self.note(text)


@dataclass
class Outcome:
    request: Request
    workload: Workload | None
    """What was planned for (None: a module profiled as it was given)."""
    recommendation: Recommendation
    profile: Profile
    profile_source: Source
    cluster: Cluster
    cluster_source: Source
    target: str
    """The devices the strategies were predicted for."""
    elsewhere: bool
    """Predicted for devices this machine does not have."""
    drift: HostDrift | None = None
    measured: list[Measured] = field(default_factory=list)

    @property
    def run(self) -> Prediction:
        """What `pipecast train --recommendation` runs: the measured fastest where it
        validated, else the predicted fastest."""
        return decide(self.measured).prediction if self.measured else self.recommendation.best

    def to_dict(self) -> dict[str, Any]:
        """The recommendation file: the workload and precision it was made for, the ranking,
        and under "run" the strategy to run."""
        rec, req, profile = self.recommendation, self.request, self.profile
        run = self.run
        return {
            "workload": self.workload.to_dict() if self.workload is not None else None,
            "device": "cuda" if self.on_gpus else "cpu",
            "dtype": req.dtype,
            "autocast": req.autocast,
            "optimizer": req.optimizer,
            "profile": {
                "device": profile.device,
                "micro_batch_sizes": list(profile.micro_batch_sizes),
                "torch": profile.torch_version,
                "host_pooled": profile.host.pooled,
            },
            "batch": rec.batch,
            # what MFU divides by: one GPU's measured dense bf16 matrix rate (docs/flops.md)
            "peak_flops": asdict(rec.peak) if rec.peak is not None else None,
            "recommended": rec.best.strategy.to_dict(),
            "reason": rec.reason(),
            "run": {
                **_entry(run, rec),
                "why": why(self.measured),
            },
            "epoch_samples": rec.epoch_samples,
            "ranked": [_entry(p, rec) for p in rec.ranked],
            # strategies left unpriced: their lower bound is above the kept-th best step
            "skipped": rec.skipped,
            "kept": rec.kept,
            "rejected": [{"label": r.strategy.label(), "reason": r.reason} for r in rec.rejected],
            "validation": [
                {
                    "label": m.prediction.strategy.label(),
                    "predicted": m.prediction.step_time,
                    "measured": m.step_time,
                    "error": m.error,
                    "rounds": list(m.rounds),
                    "spread": m.spread,
                    "peak_memory": m.prediction.peak_memory,
                    "peak_allocated": list(m.peak_allocated),
                    "peak_reserved": list(m.peak_reserved),
                    "fits": m.fits,
                }
                for m in self.measured
            ],
            # hostspeed.reference() seconds as profiled and now (absent: profiled just now)
            "host_speed": self.drift.to_dict() if self.drift is not None else None,
        }

    @property
    def on_gpus(self) -> bool:
        return self.cluster.device not in (*UNNAMED, "cpu")

    def save(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        jsonio.write_atomic(path, json.dumps(self.to_dict(), indent=1))


def _entry(p: Prediction, rec: Recommendation) -> dict[str, Any]:
    return {
        "strategy": p.strategy.to_dict(),
        "label": p.strategy.label(),
        "step_time": p.step_time,
        "samples_per_second": p.samples_per_second,
        "epoch_time": rec.epoch_time(p),
        "comm": p.comm_fraction,
        "peak_memory": p.peak_memory,
        "host_memory": p.host_memory,
        "bubble": p.timeline.bubble_fraction,
        "host_share": p.timeline.host_share,
        "host_bound": p.host_bound,
        "likely_measured": list(p.measured_range),
        # model FLOPs (recomputation not counted) and hardware FLOPs per step; 0: not counted
        "model_flops": p.model_flops,
        "hardware_flops": p.hardware_flops,
        "tflops_per_gpu": p.flops_per_gpu / 1e12,
        "mfu": rec.mfu(p),
        "partition": p.partition.boundaries,
        "plan": p.plan.to_text(),
    }


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def both_profiles() -> ConfigError:
    return ConfigError(
        "--recalibrate measures a new profile and --profile gives one: drop one of them"
    )


def with_defaults(request: Request) -> Request:
    """`request` with what it leaves open filled in, or a ConfigError for what cannot go
    together. On GPUs: ResNet-50 on ImageNet shapes in bf16, batch 256, over every GPU. On a
    machine without GPUs and without a named cluster: the same, predicted for an 8-GPU H100
    node from shipped profiles; with `device='cpu'`, ResNet-18 on CIFAR-10 shapes in fp32,
    batch 32, over 4 CPU ranks of this machine."""
    r = request
    device = r.device if r.device != "auto" else ("cuda" if _has_cuda() else "cpu")
    cluster = r.cluster
    if cluster is None and r.device == "auto" and device == "cpu" and r.profile is None:
        # without GPUs, plan for a GPU node where pipecast ships a profile of the model
        node = PRESETS[NO_GPU_PRESET]
        planned = r.workload or Workload(model="resnet50", dataset="imagenet")
        if not r.autocast and reference_profile(planned, r.dtype or "bf16", node.device):
            cluster = node
    if r.cuda_graphs and r.validate and device != "cuda":
        raise ConfigError(
            "--cuda-graphs with --validate would run CUDA graphs, which need GPUs: "
            "drop --validate to rank them here"
        )
    if r.recalibrate and r.profile is not None:
        raise both_profiles()
    if r.profile is not None and r.workload is not None and r.profile.workload:
        profiled = Workload.from_dict(r.profile.workload)
        if profiled.key != r.workload.key:
            raise ConfigError(
                f"the profile is of {profiled.key}, not {r.workload.key}: profile that model "
                "(pipecast profile) or drop --model to plan for the profile's"
            )
    target = cluster.device if cluster is not None else devices.name(devices.resolve(device))
    on_gpus = device == "cuda" or target not in (*UNNAMED, "cpu")
    workload = r.workload
    if workload is None and r.profile is not None and r.profile.workload:
        workload = Workload.from_dict(r.profile.workload)
    if workload is None and r.profile is None:
        workload = (
            Workload(model="resnet50", dataset="imagenet")
            if on_gpus
            else Workload(model="resnet18", dataset="cifar10")
        )
    dataset = workload.dataset if workload is not None else (r.profile.dataset if r.profile else "")
    gpus = r.gpus or (
        _cuda_count() if device == "cuda" and cluster is None else cluster.world if cluster else 4
    )
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    if cluster is None and device == "cpu" and gpus > MAX_CPU_RANKS:
        raise ConfigError(
            f"{gpus} CPU ranks is more than this planner measures ({MAX_CPU_RANKS}): plan "
            "for GPUs with --cluster h100-nvlink (or a cluster file), or use fewer --gpus"
        )
    if cluster is None and device == "cuda" and gpus > _cuda_count():
        raise ConfigError(
            f"{gpus} GPUs requested but this machine has {_cuda_count()}: use --gpus "
            f"{_cuda_count()} or fewer, or plan for more with --cluster"
        )
    return replace(
        r,
        workload=workload,
        device=device,
        cluster=cluster,
        dtype=r.dtype or ("bf16" if on_gpus else "fp32"),
        batch=r.batch or (256 if on_gpus else 32),
        gpus=gpus,
        epoch_samples=r.epoch_samples or epoch_samples(dataset),
    )


def _cuda_count() -> int:
    import torch

    return int(torch.cuda.device_count())


def refuse_early(r: Request) -> tuple[str, str, bool]:
    """What `recommend_for` refuses before it profiles or measures anything (a module given
    to pipecast.recommend is profiled before its request gets there: it asks first); returns
    the device here, the one planned for and whether they differ."""
    if r.validate and r.workload is None:
        raise ConfigError(
            "validating runs the model in fresh processes, which need it by name: pass a "
            "zoo model or package.module:factory to validate"
        )
    here = devices.name(devices.resolve(r.device))
    target = r.cluster.device if r.cluster is not None else here
    elsewhere = not carries(here, target)
    if elsewhere and r.validate:
        raise ConfigError(
            f"--validate measures strategies here ({here}), but they are predicted for "
            f"{target}: drop --validate, or run it on that machine"
        )
    return here, target, elsewhere


def recommend_for(request: Request, events: Events | None = None) -> Outcome:
    """Rank every strategy for `request` (with_defaults fills it in) and, if it asks,
    measure the close calls."""
    ev = events or Events()
    r = with_defaults(request)
    assert r.dtype is not None
    here, target, elsewhere = refuse_early(r)
    profile, psource = profile_for(r, elsewhere, target, here, ev)
    variants = list(r.variants) + variants_for(r, profile, psource, elsewhere, ev)
    # forward FLOPs for MFU: a profile taken before the profiler counted them (the shipped
    # ones among them) has them counted from its workload, shapes only
    profile, variants = counted(profile), [counted(v) for v in variants]
    cluster, csource = cluster_for(r, ev, defaulted=request.cluster is None)
    if r.memory_limit:
        cluster = replace(cluster, memory_bytes=r.memory_limit)
    if ev.calibrated is not None:
        ev.calibrated(profile, psource, cluster, csource)
    graphed = r.cuda_graphs if r.cuda_graphs is not None else profile.device != "cpu"
    if graphed and not profile.graph_times:
        why = f": {profile.graph_failure}" if profile.graph_failure else ""
        ev.say(
            "graphed strategies are predicted from eager device times: the profile has no "
            f"graph replay times{why}"
        )
    rec = recommend(
        profile,
        cluster,
        r.batch,
        gpus=r.gpus,
        optimizer=r.optimizer,
        memory_margin=r.memory_margin,
        epoch_samples=r.epoch_samples,
        methods=r.methods,
        cuda_graphs=r.cuda_graphs,
        serving=r.serve,
        variants=variants,
        keep=_kept(r),
    )
    if ev.ranked is not None:
        ev.ranked(rec)
    if elsewhere and len(rec.close_calls()) > 1:
        ev.say(
            f"predicted for {target}, not measured here: --validate auto on that machine "
            "decides the close calls"
        )
    drift = None
    if psource in ("given", "cached"):  # one measured just now needs no check of the host
        drift = host_drift(
            profile.host.reference,
            hostspeed.reference(),
            profiled_on=profile.host.machine,
            here=hostspeed.machine(),
            cached=psource == "cached",
        )
    if drift is not None and (note := drift.note(any(p.host_bound for p in rec.close_calls()))):
        ev.say(note)
    outcome = Outcome(
        request=r,
        workload=r.workload,
        recommendation=rec,
        profile=profile,
        profile_source=psource,
        cluster=cluster,
        cluster_source=csource,
        target=target,
        elsewhere=elsewhere,
        drift=drift,
    )
    if r.validate:
        outcome.measured = _validate(r, rec, ev)
    return outcome


def _kept(r: Request) -> int | None:
    """How many of the fastest to rank exactly: enough for --validate K too (None: all)."""
    if not r.keep:
        return None
    return max(r.keep, r.validate if isinstance(r.validate, int) else 0)


def _validate(r: Request, rec: Recommendation, ev: Events) -> list[Measured]:
    """--validate K: the top K; auto: the close calls (validate.measure_candidates)."""
    assert r.workload is not None and r.dtype is not None
    pool = rec.close_calls() if r.validate == "auto" else rec.ranked
    return measure_candidates(
        pool[: len(pool) if r.validate == "auto" else int(r.validate)],
        rec.ranked,
        r.workload,
        device=r.device,
        config=RunConfig(dtype=r.dtype, autocast=r.autocast, optimizer=r.optimizer),
        rounds=r.rounds,
        local=_cuda_count() if r.device == "cuda" else 8,
        progress=ev.validating,
    )
