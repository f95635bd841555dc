"""Partition: which blocks each pipeline stage runs and which devices hold it (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pipecast import jsonio
from pipecast.errors import ConfigError

FORMAT_VERSION = 1
Placement = Literal["one", "loop", "v"]


@dataclass(frozen=True, slots=True)
class Stage:
    start: int
    """First block (inclusive)."""
    stop: int
    """Last block + 1."""
    devices: tuple[int, ...] = (0,)
    """Cluster ranks holding this stage, one per data-parallel replica."""

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


def from_boundaries(
    boundaries: list[int],
    *,
    method: str = "given",
    placement: Placement = "one",
    ranks: int | None = None,
    replicas: int = 1,
) -> Partition:
    """A Partition from split points [0, b1, ..., N]. Devices: stage s on pipeline rank
    (s, s % ranks, or V-shaped), replica k on rank + k * ranks."""
    stages = len(boundaries) - 1
    ranks = ranks or stages
    out = []
    for s in range(stages):
        if placement == "one":
            rank = s
        elif placement == "loop":
            rank = s % ranks
        else:
            rank = s if s < ranks else 2 * ranks - 1 - s
        devices = tuple(rank + k * ranks for k in range(replicas))
        out.append(Stage(boundaries[s], boundaries[s + 1], devices))
    return Partition(
        stages=tuple(out), num_blocks=boundaries[-1], method=method, placement=placement
    )
