"""Partition: which blocks each pipeline stage runs and which devices hold it (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipecast import jsonio
from pipecast.errors import ConfigError
from pipecast.values.parallel import Layout, Placement

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Stage:
    start: int
    """First block (inclusive)."""
    stop: int
    """Last block + 1."""
    devices: tuple[int, ...] = (0,)
    """Cluster ranks holding this stage, one per data-parallel replica (its first
    tensor-parallel rank; Layout.stage_ranks)."""

    @property
    def replicas(self) -> int:
        return len(self.devices)

    @property
    def blocks(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True, kw_only=True)
class Partition:
    """Contiguous, non-empty stages covering every block once, in order."""

    stages: tuple[Stage, ...]
    num_blocks: int
    method: str = "given"
    placement: Placement = "one"
    """'one' stage per device; 'loop' (interleaved) or 'v' (zero-bubble V): several each."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("a partition needs at least one stage")
        expect = 0
        for i, st in enumerate(self.stages):
            if st.start != expect or st.stop <= st.start:
                raise ConfigError(
                    f"stage {i} covers blocks [{st.start}, {st.stop}) but must start at block "
                    f"{expect} and be non-empty: stages are contiguous and cover every block"
                )
            if not st.devices or len(set(st.devices)) != len(st.devices):
                raise ConfigError(f"stage {i} needs distinct devices, got {st.devices}")
            expect = st.stop
        if expect != self.num_blocks:
            raise ConfigError(
                f"stages end at block {expect} but the model has {self.num_blocks} blocks"
            )

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def boundaries(self) -> list[int]:
        """[0, end of stage 0, ..., num_blocks], the form splits are written in."""
        return [0, *(s.stop for s in self.stages)]

    @property
    def replicas(self) -> int:
        """Data-parallel replicas when uniform, else the largest count."""
        return max(s.replicas for s in self.stages)

    @property
    def devices(self) -> list[int]:
        return sorted({d for s in self.stages for d in s.devices})

    def stage_of_block(self, block: int) -> int:
        for i, st in enumerate(self.stages):
            if st.start <= block < st.stop:
                return i
        raise ConfigError(f"block {block} is outside the partition's {self.num_blocks} blocks")

    def describe(self) -> str:
        parts = []
        for i, st in enumerate(self.stages):
            dev = ",".join(map(str, st.devices))
            parts.append(f"stage {i}: blocks {st.start}-{st.stop - 1} on {dev}")
        return "; ".join(parts)

    def to_json(self) -> str:
        return jsonio.dump(
            "partition",
            FORMAT_VERSION,
            {
                "method": self.method,
                "placement": self.placement,
                "num_blocks": self.num_blocks,
                "stages": [[s.start, s.stop, list(s.devices)] for s in self.stages],
                "meta": self.meta,
            },
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Partition:
        doc = jsonio.load("partition", FORMAT_VERSION, text, source)
        return cls(
            stages=tuple(Stage(a, b, tuple(d)) for a, b, d in doc["stages"]),
            num_blocks=doc["num_blocks"],
            method=doc.get("method", "given"),
            placement=doc.get("placement", "one"),
            meta=doc.get("meta", {}),
        )


def pipeline_layout(
    stages: int,
    *,
    placement: Placement = "one",
    ranks: int | None = None,
    replicas: int = 1,
    tp: int = 1,
) -> Layout:
    """Where a pipeline of `stages` stages runs: `ranks` pipeline ranks (default: one per
    stage), each running stages // ranks of them by `placement`, `replicas` times over, each
    place split over `tp` tensor-parallel ranks (values/parallel.py)."""
    ranks = ranks or stages
    if stages % ranks:
        raise ConfigError(
            f"{stages} stages do not share out evenly over {ranks} pipeline ranks: give "
            f"boundaries for {ranks} stages (a multiple of {ranks} for interleaved and zb-v), "
            "or as many ranks (GPUs) as stages"
        )
    virtual = stages // ranks
    return Layout(
        replicas=replicas,
        pipeline=ranks,
        virtual=virtual,
        placement=placement if virtual > 1 else "one",
        tensor=tp,
    )


def from_boundaries(
    boundaries: list[int],
    *,
    method: str = "given",
    placement: Placement = "one",
    ranks: int | None = None,
    replicas: int = 1,
    tp: int = 1,
) -> Partition:
    """A Partition from split points [0, b1, ..., N], each stage on the ranks the pipeline's
    layout gives it (pipeline_layout; Layout.stage_ranks): one per replica, each that
    replica's first tensor-parallel rank of the stage's pipeline rank, so its replicas and
    pipeline neighbours are `tp` ranks apart and more, as the runtime numbers them."""
    stages = len(boundaries) - 1
    layout = pipeline_layout(stages, placement=placement, ranks=ranks, replicas=replicas, tp=tp)
    out = tuple(
        Stage(boundaries[s], boundaries[s + 1], layout.stage_ranks(s)) for s in range(stages)
    )
    return Partition(stages=out, num_blocks=boundaries[-1], method=method, placement=placement)
