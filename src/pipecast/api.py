"""The Python API: train or run inference on a model through a pipeline, or find the
fastest way to, in one call.

    import pipecast
    result = pipecast.train(my_sequential, dataset="cifar10", gpus=4, schedule="1f1b",
                            microbatches=8, batch=256, device="cuda")
    print(result.summary["samples_per_second"])
    best = pipecast.recommend("resnet50", dataset="imagenet", batch=256, gpus=8)
    print(best.recommendation.reason())
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pipecast.errors import ConfigError
from pipecast.measuring.profiler.options import ProfileOptions
from pipecast.measuring.profiler.profiler import profile_model, quick_profile
from pipecast.orchestration.recommend.calibrate import profile_sizes
from pipecast.orchestration.recommend.session import (
    Outcome,
    Request,
    recommend_for,
    refuse_early,
    with_defaults,
)
from pipecast.planning.partition.boundaries import (
    parse_boundaries,
    placement_of,
    split,
    virtual_hint,
)
from pipecast.planning.partition.methods import measured_spread
from pipecast.planning.schedules.generators import make_plan, stages_per_rank
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import under_torchrun
from pipecast.runtime.run import JobResult, run_job
from pipecast.values.data.registry import get_spec
from pipecast.values.data.source import DataSource, as_arrays
from pipecast.values.hardware.load import default_cluster, load_cluster
from pipecast.values.models.registry import get_entry
from pipecast.values.models.sources import default_dataset, is_source_path
from pipecast.values.models.user import as_sequential
from pipecast.values.models.workload import Workload
from pipecast.values.partition import from_boundaries
from pipecast.values.plan.action import Plan
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Shard


def make_job(
    model: nn.Module | list[nn.Module] | Workload,
    *,
    dataset: str | None = None,
    gpus: int = 2,
    replicas: int = 1,
    schedule: str = "1f1b",
    virtual: int = 0,
    microbatches: int = 8,
    batch: int = 64,
    partition: str = "auto",
    steps: int = 10,
    warmup_steps: int = 2,
    device: str = "cpu",
    config: RunConfig | None = None,
    exact_init: bool = True,
    checkpoint: Checkpointing | None = None,
    data: object = None,
    data_dir: str | None = None,
    shard: Shard = "none",
    tensor_parallel: int = 1,
    plan: Plan | None = None,
    context_parallel: int = 1,
) -> tuple[TrainJob, Profile | None]:
    """The job `train`/`infer` run, built and checked without starting any process, and the
    quick profile the automatic partition came from (None for explicit boundaries).
    `checkpoint`: write the training state as the run goes, and resume from it
    (pipecast.runtime.checkpoint; `model_state(dir)` gives the trained model's state dict).
    Real samples to train on: `data`, (inputs, targets) tensors, an ArrayData or a dataset of
    (input, target) pairs; or `data_dir`, MNIST or CIFAR-10 files for `dataset`. Without
    either, batches are synthetic (real for 'digits'). `shard`: the replicas shard the
    weights with torch's FSDP ('full' or 'grad', Strategy.shard); `tensor_parallel`: each
    pipeline rank's blocks split over this many GPUs (the GPUs are replicas x stages x
    tensor_parallel). Both run eagerly. `virtual`: the stages each pipeline rank runs
    under the interleaved schedule (any from 2; 0: its default, 2), so the partition has
    stages x virtual of them. `context_parallel`: each sequence split over this many GPUs
    more (pipecast.runtime.context)."""
    config = _checked_layout(
        device, gpus, replicas, tensor_parallel, shard, config, context_parallel
    )
    workload = model if isinstance(model, Workload) else None
    sequential = None if workload else as_sequential(model)
    spec = workload.spec if workload else get_spec(dataset or "mnist")
    stages = gpus // (replicas * tensor_parallel * context_parallel)
    if plan is None:
        plan = make_plan(
            schedule, stages, microbatches, virtual=virtual, weight_batch=config.weight_batch
        )
    elif (plan.num_ranks, plan.num_microbatches) != (stages, microbatches):
        raise ConfigError(
            f"the given plan runs {plan.num_ranks} ranks x {plan.num_microbatches} micro-batches"
            f", the job {stages} x {microbatches}: make the plan for {stages} x {microbatches}"
            ", or give the job the plan's counts (gpus, microbatches), or leave the plan out"
        )
    micro_batch = max(batch // (replicas * microbatches), 1)
    blocks = sequential if sequential is not None else workload.shapes()  # type: ignore[union-attr]
    bounds = None if partition == "auto" else parse_boundaries(partition, len(blocks))
    stage_count = stages * stages_per_rank(schedule, virtual)
    _check_stage_count(bounds, stage_count, len(blocks), schedule, stages)
    provisional = bounds or [round(len(blocks) * i / stage_count) for i in range(stage_count + 1)]
    job = TrainJob(
        plan=plan,
        partition=from_boundaries(
            provisional, placement=placement_of(schedule), ranks=stages, replicas=replicas
        ),
        batch=batch,
        workload=workload,
        model=sequential,
        dataset=dataset or spec.name,
        replicas=replicas,
        shard=shard,
        tp=tensor_parallel,
        cp=context_parallel,
        config=config,
        device="cuda" if device == "cuda" else "cpu",  # checked above: one of the two
        steps=steps,
        warmup_steps=warmup_steps,
        exact_init=exact_init,
        checkpoint=checkpoint,
        data=_source(spec.name, data, data_dir),
    )
    if bounds is not None:
        job.check()
        return job, None
    job.check()  # everything but the split, before the quick profile takes its time
    fresh = copy.deepcopy(sequential) if sequential is not None else workload.build()  # type: ignore[union-attr]
    profile = quick_profile(
        fresh,
        spec,
        micro_batch,
        device=_profiling_device(device),
        dtype=config.dtype,
        autocast=config.autocast,
        name=workload.model if workload else "model",
    )
    part = split(
        profile,
        default_cluster(profile.device, gpus),
        how="balanced" if partition == "auto" else partition,
        schedule=schedule,
        ranks=stages,
        replicas=replicas,
        virtual=virtual,
        micro_batch=micro_batch,
        microbatches=microbatches,
        # a quick profile's few repeats move from run to run: splits within its spread
        # are one to it, and the same command gets the same split
        tolerance=measured_spread(profile, micro_batch),
    )
    job = replace(job, partition=part)
    job.check()
    return job, profile


def _checked_layout(
    device: str,
    gpus: int,
    replicas: int,
    tensor_parallel: int,
    shard: Shard,
    config: RunConfig | None,
    context_parallel: int = 1,
) -> RunConfig:
    """ConfigError unless the GPUs split into replicas x context- x tensor-parallel ranks of
    equal pipelines on a known device; the run's config, eager where torch's FSDP or tensor
    parallelism or context parallelism runs the blocks."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu' or 'cuda', got {device!r}")
    width = replicas * tensor_parallel * context_parallel
    if min(replicas, tensor_parallel, context_parallel) < 1 or gpus % width:
        within = f"{context_parallel} context- x " if context_parallel != 1 else ""
        raise ConfigError(
            f"{gpus} GPU(s) do not split into {replicas} replica(s) x {within}"
            f"{tensor_parallel} tensor-parallel rank(s) of equal pipelines: give counts of at "
            "least 1 whose product divides the GPUs"
        )
    config = config or RunConfig()
    meshed = tensor_parallel > 1 or (shard != "none" and replicas > 1) or context_parallel > 1
    if meshed and config.cuda_graphs is None:
        config = replace(config, cuda_graphs=False)
    return config


def _check_stage_count(
    bounds: list[int] | None, stages: int, blocks: int, schedule: str, ranks: int
) -> None:
    """ConfigError where the model's blocks cannot make the `stages` stages `schedule` runs
    over `ranks` ranks: fewer blocks than stages, or interleaved boundaries for another
    count of virtual stages (the count they need named; other mismatches the job's own
    checks name)."""
    hint = virtual_hint(schedule, len(bounds) - 1, ranks) if bounds is not None else ""
    if bounds is not None and len(bounds) - 1 != stages and hint:
        raise ConfigError(
            f"boundaries {bounds} give {len(bounds) - 1} stages; {schedule} on {ranks} "
            f"pipeline rank(s) needs {stages}{hint}"
        )
    if stages > blocks:
        raise ConfigError(
            f"{schedule} on {ranks} pipeline rank(s) runs {stages} stages, but the model has "
            f"{blocks} blocks: use fewer ranks or virtual stages (at most {blocks} stages)"
        )


def _profiling_device(device: str) -> str:
    """Where the quick profile runs: under torchrun, each rank on its own GPU (eight ranks
    of a node on GPU 0 would time one another); rank 0's partition is the one run
    (runtime.run.agreed)."""
    if device != "cuda":
        return "cpu"
    return f"cuda:{os.environ['LOCAL_RANK']}" if under_torchrun() else "cuda"


def _source(dataset: str, data: object, data_dir: str | None) -> DataSource | None:
    if data is not None and data_dir is not None:
        raise ConfigError("give data or data_dir, not both")
    if data is not None:
        return DataSource(dataset, arrays=as_arrays(data))
    return DataSource(dataset, directory=data_dir) if data_dir is not None else None


def train(model: nn.Module | list[nn.Module] | Workload, **kwargs: object) -> JobResult:
    """Train `model` (an nn.Sequential, a list of modules, or a Workload) through a pipeline;
    see make_job for the options. Returns every rank's measurements."""
    job, _ = make_job(model, **kwargs)  # type: ignore[arg-type]
    result = run_job(job)
    assert result is not None
    return result


def infer(model: nn.Module | list[nn.Module] | Workload, **kwargs: object) -> JobResult:
    """Pipelined inference (a forward-only plan) with the same options as train."""
    kwargs = {**kwargs, "schedule": "forward-only"}
    return train(model, **kwargs)


def recommend(
    model: str | Workload | nn.Module | list[nn.Module],
    *,
    dataset: str | None = None,
    **options: Any,
) -> Outcome:
    """Rank every strategy for `model` and pick the fastest, as `pipecast recommend` does:
    `model` a zoo name or package.module:factory (with `dataset`), a Workload, or a module
    (an nn.Sequential or a list of modules, profiled here: no cache, no --validate);
    `cluster` a Cluster, a preset's name ('h100-nvlink') or a cluster file.
    `options` are pipecast.orchestration.recommend.session.Request's fields (batch, gpus, device,
    dtype, cluster, validate, ...). Returns the Outcome: .recommendation ranks them."""
    if isinstance(options.get("cluster"), str):  # a preset's name or a cluster file
        options["cluster"] = load_cluster(options["cluster"])
    if isinstance(model, str):
        if dataset is None:
            source = is_source_path(model)
            dataset = default_dataset(model) if source else get_entry(model).default_dataset
        workload = Workload(model=model, dataset=dataset)
        return recommend_for(Request(workload=workload, **options))
    if isinstance(model, Workload):
        return recommend_for(Request(workload=model, **options))
    # profiled here: planned for here (a preset's GPUs would need their own profile)
    if options.get("device", "auto") == "auto":
        options["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    request = with_defaults(Request(**options))
    refuse_early(replace(request, workload=None))  # before the profiling, not after it
    spec = get_spec(dataset or "mnist")
    assert request.dtype is not None
    profile = profile_model(
        as_sequential(model),
        spec,
        ProfileOptions(
            micro_batch_sizes=profile_sizes(request.batch, request.gpus),
            device=request.device if request.device != "auto" else "cpu",
            dtype=request.dtype,
            autocast=request.autocast,
        ),
        model_name="model",
    )
    return recommend_for(replace(request, workload=None, profile=profile))
