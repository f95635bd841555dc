"""Layout: the degree of each parallelism in a job and the one order of its ranks.

A job's ranks form one grid. Its axes, outermost first:

    data      replicas of the model, each given its own samples; `fsdp` of them shard one
              copy of the weights between them (FSDP), replicas / fsdp such groups each
              hold a copy (HSDP's replicate-outer, shard-inner order, as torchtitan has it)
    pipeline  pipeline ranks, each running `virtual` of the pipeline's stages
    context   ranks splitting each sample's sequence (context parallelism; degree 1 until
              the runtime runs it)
    tensor    ranks splitting each block's weights (tensor parallelism)

A rank is its place in that grid read row-major, the last axis fastest,

    rank = ((replica x pipeline + p) x context + c) x tensor + t

the number torch's init_device_mesh gives the place of a mesh of these degrees, so the
runtime's own process groups and torch's sub-meshes name the same processes. The runtime
(meshes, process groups) and the planner (where stages sit, what each collective spans)
both ask this value, so what is priced is what runs: the tensor-parallel ranks of a place
are neighbours on a node, and a stage's replicas and a rank's pipeline neighbours sit
context x tensor ranks apart and beyond, on other nodes once those fill one.

Words: a *degree* is the count of ranks on an axis; an axis's *group* of a rank is the
ranks that differ from it on that axis only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

from pipecast.errors import ConfigError

Placement = Literal["one", "loop", "v"]
"""Which pipeline rank runs each stage: 'one' stage per rank; 'loop' (interleaved) stage s
on rank s mod ranks; 'v' (zero-bubble V) down the ranks and back up, lap after lap."""

Axis = Literal["data", "replicate", "fsdp", "pipeline", "context", "tensor"]
"""An axis to group ranks along: 'data' is every replica; 'fsdp' the replicas sharding one
copy; 'replicate' the copies (one replica of each FSDP group, at the same place in it)."""


class Place(NamedTuple):
    """Where one rank sits, outermost axis first."""

    replica: int
    pipeline: int
    context: int
    tensor: int


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The degree of each axis of a job (see the module's docstring for their order)."""

    replicas: int = 1
    """Data-parallel replicas."""
    fsdp: int = 1
    """Replicas that shard one copy of the weights between them: 1, each replica holds a
    whole copy; `replicas`, FSDP over them all; a divisor between, HSDP."""
    pipeline: int = 1
    """Pipeline ranks per replica."""
    virtual: int = 1
    """Pipeline stages each pipeline rank runs (more than 1: interleaved or V)."""
    placement: Placement = "one"
    """Which pipeline rank runs each stage (`stage_rank`)."""
    context: int = 1
    """Context-parallel ranks per pipeline rank."""
    tensor: int = 1
    """Tensor-parallel ranks per pipeline rank (per context-parallel rank)."""

    def __post_init__(self) -> None:
        degrees = {
            "replicas": self.replicas,
            "fsdp": self.fsdp,
            "pipeline": self.pipeline,
            "virtual": self.virtual,
            "context": self.context,
            "tensor": self.tensor,
        }
        low = {name: d for name, d in degrees.items() if d < 1}
        if low:
            raise ConfigError(f"every degree of a layout is at least 1, got {low}")
        if self.replicas % self.fsdp:
            raise ConfigError(
                f"{self.replicas} replicas do not split into FSDP groups of {self.fsdp}: "
                "shard over a divisor of the replicas"
            )
        if self.placement == "one" and self.virtual != 1:
            raise ConfigError(
                f"{self.virtual} stages per pipeline rank need a placement of several per "
                "rank ('loop' or 'v'), not 'one'"
            )

    @property
    def world(self) -> int:
        """Ranks in the job."""
        return self.replicas * self.pipeline * self.context * self.tensor

    @property
    def stages(self) -> int:
        """Pipeline stages per replica."""
        return self.pipeline * self.virtual

    @property
    def replicate(self) -> int:
        """Copies of the weights: replicas / fsdp."""
        return self.replicas // self.fsdp

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(replicas, pipeline, context, tensor): the mesh's shape, outermost first."""
        return (self.replicas, self.pipeline, self.context, self.tensor)

    def rank(
        self, *, replica: int = 0, pipeline: int = 0, context: int = 0, tensor: int = 0
    ) -> int:
        """The rank at this place."""
        return self.rank_of(Place(replica, pipeline, context, tensor))

    def rank_of(self, place: Place) -> int:
        """The rank at `place`."""
        for name, at, degree in zip(Place._fields, place, self.shape, strict=True):
            if not 0 <= at < degree:
                raise ConfigError(f"{name} {at} is outside the layout's {degree} ({self})")
        replica, pipeline, context, tensor = place
        return (
            (replica * self.pipeline + pipeline) * self.context + context
        ) * self.tensor + tensor

    def place(self, rank: int) -> Place:
        """Where `rank` sits."""
        if not 0 <= rank < self.world:
            raise ConfigError(f"rank {rank} is outside the layout's {self.world} ranks")
        rest, tensor = divmod(rank, self.tensor)
        rest, context = divmod(rest, self.context)
        replica, pipeline = divmod(rest, self.pipeline)
        return Place(replica, pipeline, context, tensor)

    def group(self, axis: Axis, rank: int) -> tuple[int, ...]:
        """The ranks that differ from `rank` only on `axis`, in the axis's order (`rank`
        among them)."""
        at = self.place(rank)
        copy, shard = divmod(at.replica, self.fsdp)
        if axis == "data":
            places = [at._replace(replica=k) for k in range(self.replicas)]
        elif axis == "fsdp":
            places = [at._replace(replica=copy * self.fsdp + k) for k in range(self.fsdp)]
        elif axis == "replicate":
            places = [at._replace(replica=k) for k in range(shard, self.replicas, self.fsdp)]
        elif axis == "pipeline":
            places = [at._replace(pipeline=p) for p in range(self.pipeline)]
        elif axis == "context":
            places = [at._replace(context=c) for c in range(self.context)]
        elif axis == "tensor":
            places = [at._replace(tensor=t) for t in range(self.tensor)]
        else:
            raise ConfigError(f"unknown axis '{axis}': choose one of {', '.join(get_args(Axis))}")
        return tuple(self.rank_of(p) for p in places)

    def replica_group(
        self, *, pipeline: int = 0, context: int = 0, tensor: int = 0
    ) -> tuple[int, ...]:
        """The ranks of every replica at one place of the pipeline: those that hold the same
        weights (or shards of them) and sum their gradients."""
        return self.group("data", self.rank(pipeline=pipeline, context=context, tensor=tensor))

    def pipeline_group(
        self, *, replica: int = 0, context: int = 0, tensor: int = 0
    ) -> tuple[int, ...]:
        """One replica's pipeline ranks, in pipeline order, at one place of the others: the
        ranks that pass it activations and gradients."""
        return self.group("pipeline", self.rank(replica=replica, context=context, tensor=tensor))

    def tensor_group(
        self, *, replica: int = 0, pipeline: int = 0, context: int = 0
    ) -> tuple[int, ...]:
        """The ranks that split the blocks of one place of the pipeline between them."""
        return self.group("tensor", self.rank(replica=replica, pipeline=pipeline, context=context))

    def stage_rank(self, stage: int) -> int:
        """The pipeline rank that runs `stage` (of `stages`), by `placement`."""
        if not 0 <= stage < self.stages:
            raise ConfigError(f"stage {stage} is outside the layout's {self.stages} stages")
        lap, at = divmod(stage, self.pipeline)
        if self.placement == "v" and lap % 2:
            return self.pipeline - 1 - at
        return at

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        """The ranks holding `stage`, one per replica (each replica's first context- and
        tensor-parallel rank), in replica order."""
        return self.replica_group(pipeline=self.stage_rank(stage))
