"""A training (or inference) job: everything every rank needs, as one picklable value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from pipecast.errors import ConfigError
from pipecast.runtime import context, float8, graphs, sharded_optimizer
from pipecast.runtime.checkpoint import Checkpointing, Saved, check_resumable, latest, stage_blocks
from pipecast.runtime.config import RunConfig
from pipecast.values.batching import check_batch
from pipecast.values.data.registry import get_spec
from pipecast.values.data.source import DataSource
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.models.tensor_plans import check_split
from pipecast.values.models.workload import Workload
from pipecast.values.parallel import Layout
from pipecast.values.partition import Partition
from pipecast.values.plan.action import Plan
from pipecast.values.strategy import Shard
from pipecast.values.training import why_not_streamed


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    plan: Plan
    partition: Partition
    batch: int
    """Global batch: samples per step over all replicas."""
    workload: Workload | None = None
    """Zoo model and data set (or a factory); each rank builds its own blocks from it."""
    model: nn.Sequential | None = None
    """A user's model object instead of a workload (sent to every rank)."""
    dataset: str | None = None
    """Data set name when `model` is given (synthetic shapes, or 'digits' for real data)."""
    data: DataSource | None = None
    """Real samples to train on (default: synthetic batches of the data set's shapes, or for
    'digits' the shipped digits)."""
    replicas: int = 1
    shard: Shard = "none"
    """How the replicas hold the weights: whole copies, or sharded by torch's FSDP
    (pipecast.runtime.sharding; Strategy.shard)."""
    tp: int = 1
    """Tensor-parallel ranks each pipeline rank's blocks are split over."""
    cp: int = 1
    """Context-parallel ranks each pipeline rank's sequences are split over
    (pipecast.runtime.context)."""
    config: RunConfig = field(default_factory=RunConfig)
    device: Literal["cpu", "cuda"] = "cpu"
    steps: int = 3
    warmup_steps: int = 1
    """Steps run first and not timed."""
    exact_init: bool = True
    """Build the whole model on CPU with the seed (weights equal a single-process run's);
    False: build only this rank's blocks, on the meta device, then initialise them there."""
    capture: bool = False
    """Return parameters and gradients after the last step (tests)."""
    checkpoint: Checkpointing | None = None
    """Write the training state to disk as the run goes, and resume from it
    (pipecast.runtime.checkpoint)."""
    before_step: Callable[[int, int], None] | None = None
    """Called on every rank as (global rank, step) at the barrier before each step, with the
    watchdog armed (a hook that never returns is reported as a hang); a module-level function
    or partial, as it travels to the ranks by pickle. Tests kill or hang a rank from here."""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> DatasetSpec:
        """The shapes the model takes."""
        return (
            self.workload.spec if self.workload is not None else get_spec(self.dataset or "mnist")
        )

    def source(self) -> DataSource:
        """Where the samples come from."""
        if self.data is not None:
            return self.data
        return DataSource(self.workload.dataset if self.workload else self.dataset or "mnist")

    @property
    def world(self) -> int:
        return self.layout_of_ranks.world

    @property
    def layout_of_ranks(self) -> Layout:
        """Where each process sits: replica, pipeline rank, context- and tensor-parallel
        rank."""
        sharded = self.shard != "none" and self.replicas > 1
        return Layout(
            replicas=self.replicas,
            fsdp=self.replicas if sharded else 1,
            pipeline=self.plan.num_ranks,
            context=self.cp,
            tensor=self.tp,
        )

    @property
    def meshed(self) -> bool:
        """Torch's FSDP or tensor parallelism runs the blocks."""
        return self.tp > 1 or (self.shard != "none" and self.replicas > 1)

    def check(self) -> None:
        """Everything that can be wrong before any process starts."""
        if self.workload is None and self.model is None:
            raise ConfigError("a job needs a workload or a model")
        if self.partition.num_stages != self.plan.num_stages:
            raise ConfigError(
                f"partition has {self.partition.num_stages} stages, plan "
                f"{self.plan.name} has {self.plan.num_stages}: give the stages as many ranks "
                f"(GPUs), or boundaries for {self.plan.num_stages} stages"
            )
        if self.model is not None:
            blocks = len(self.model)
        else:
            assert self.workload is not None
            blocks = self.workload.block_count()
        if blocks != self.partition.num_blocks:
            raise ConfigError(
                f"partition covers {self.partition.num_blocks} blocks, the model has {blocks}: "
                f"give boundaries that end at {blocks}"
            )
        check_batch(self.batch, self.replicas, self.plan.num_microbatches)
        if self.steps < 1:
            raise ConfigError(f"steps must be at least 1, got {self.steps}")
        if (self.config.loss_scale or 0.0) > 0 and self.plan.async_updates:
            raise ConfigError(
                "loss scaling skips a step the whole pipeline overflowed in; PipeDream updates "
                "each stage on its own after every micro-batch (use bf16, or loss_scale 0)"
            )
        if self.config.clip_grad_norm > 0 and self.plan.async_updates:
            raise ConfigError(
                "gradient clipping needs the whole model's gradients at once; PipeDream "
                "updates each stage on its own after every micro-batch (leave clipping off, "
                "or use a schedule that updates once a step, such as 1f1b)"
            )
        if self.plan.async_updates and self.replicas > 1 and not self.meshed:
            raise ConfigError(  # what the engine refuses in every rank, refused here once
                "PipeDream's asynchronous updates with data-parallel replicas are not "
                "supported: use one replica, or a synchronous schedule such as 1f1b"
            )
        if why := why_not_streamed(
            self.config.offload, self.config.recompute, self.plan.async_updates
        ):
            raise ConfigError(why)
        graphs.check(self.plan, self.config, self.device)
        if self.config.float8 and (why := float8.why_not(self.device)):
            raise ConfigError(why)
        if why := sharded_optimizer.why_not(
            self.config, self.replicas, self.shard, self.tp, checkpoints=self.checkpoint is not None
        ):
            raise ConfigError(why)
        if self.meshed:
            self._check_mesh()
        if self.cp != 1:
            self._check_context()
        self.source().check(self.spec, self.batch)
        self.resume_from()

    def _check_mesh(self) -> None:
        """What FSDP and tensor parallelism cannot run with, each a one-line error before
        anything starts."""
        name = "FSDP" if self.tp == 1 else "tensor parallelism"
        cfg = self.config
        refused = [
            (self.tp < 1, f"tensor-parallel degree must be at least 1, got {self.tp}"),
            (
                self.shard == "full" and self.plan.num_ranks > 1,
                "resharding after each forward inside a pipeline (its FSDP stages stay "
                "gathered through the step: --shard grad)",
            ),
            (self.plan.async_updates, "PipeDream's per-micro-batch updates"),
            (cfg.offload != "none", f"moving {cfg.offload} to the host"),
            (cfg.clip_grad_norm > 0, "gradient clipping (its norm over sharded gradients)"),
            ((cfg.loss_scale or 0.0) > 0, "fp16 loss scaling (use bf16)"),
            (self.checkpoint is not None, "checkpoints (--checkpoint-dir)"),
            (graphs.enabled(self.plan, cfg, self.device), "CUDA graphs (--no-cuda-graphs)"),
        ]
        for bad, what in refused:
            if bad:
                raise ConfigError(f"{name} does not run with {what}: leave it out")
        if self.tp > 1:
            model = self.model if self.model is not None else None
            if model is None:
                assert self.workload is not None
                model = self.workload.shapes()
            check_split(list(model), self.tp)

    def _check_context(self) -> None:
        """What context parallelism cannot run with, each a one-line error before anything
        starts."""
        if self.cp < 1:
            raise ConfigError(f"context-parallel degree must be at least 1, got {self.cp}")
        cfg = self.config
        refused = [
            (self.tp > 1, "tensor parallelism"),
            (self.shard != "none" and self.replicas > 1, "FSDP"),
            (self.plan.async_updates, "PipeDream's per-micro-batch updates"),
            (self.plan.forward_only, "a forward-only plan"),
            (cfg.offload != "none", f"moving {cfg.offload} to the host"),
            (self.checkpoint is not None, "checkpoints (--checkpoint-dir)"),
            (graphs.enabled(self.plan, cfg, self.device), "CUDA graphs (--no-cuda-graphs)"),
        ]
        for bad, what in refused:
            if bad:
                raise ConfigError(f"context parallelism does not run with {what}: leave it out")
        model = self.model
        if model is None:
            assert self.workload is not None
            model = self.workload.build("meta")
        context.check(model, self.spec.sample_shape[0], self.cp)

    @property
    def total_steps(self) -> int:
        """Steps from the start of training, warm-up included."""
        return self.warmup_steps + self.steps

    def resume_from(self) -> Saved | None:
        """The checkpoint this job starts from (None: from scratch); a one-line error where
        its directory holds the wrong one, or holds one and resuming was not asked for."""
        cp = self.checkpoint
        if cp is None:
            return None
        if self.plan.name == "forward-only":
            raise ConfigError(
                "a forward-only run trains nothing to checkpoint: leave the checkpoint out"
            )
        saved = latest(cp.dir)
        if saved is None:
            return None
        if not cp.resume:
            raise ConfigError(
                f"{cp.dir} already holds a checkpoint (step {saved.step}): resume from it, "
                f"or write to another directory"
            )
        check_resumable(
            saved,
            blocks=self.partition.num_blocks,
            optimizer=self.config.optimizer,
            total=self.total_steps,
        )
        return saved

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint of this job records beside its files (meta.json)."""
        part = self.partition
        return {
            "model": self.workload.model if self.workload else "model",
            "blocks": part.num_blocks,
            "stage_blocks": stage_blocks((i, s.start, s.stop) for i, s in enumerate(part.stages)),
            "optimizer": self.config.optimizer,
            "dtype": self.config.dtype,
            "layout": self.layout,
        }

    @property
    def layout(self) -> str:
        """Plan, split and world: a run of the same layout draws the same random numbers on
        the same rank, so a checkpoint's generator states carry to it."""
        return f"{self.plan.name} {self.partition.boundaries} x{self.replicas}"
