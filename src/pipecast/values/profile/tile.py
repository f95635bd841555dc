"""A deep model's profile from a few of its layers: the measured layers tiled to the full depth.

A model too large for the GPU at hand (80 layers of width 8192) cannot be profiled whole,
but its layers are copies of one another: a profile of the same model at a few layers
measures everything there is to measure. `repeat_of` finds where the layers sit among the
blocks from two shapes-only builds (the blocks before the first layer, the blocks one layer
adds, the blocks after the last); `tiled` repeats the last measured layer's blocks to the
full depth and renumbers them. The profile says what it did (Profile.tiled): which depth
was measured and which was tiled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipecast.errors import ConfigError
from pipecast.values.models.summary import block_name
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import BlockProfile, Profile


@dataclass(frozen=True)
class Repeat:
    """Where the layers sit among a model's blocks: `prefix` blocks before the first layer,
    `period` blocks a layer, the rest after the last."""

    prefix: int
    period: int


def repeat_of(one: Sequence[str], two: Sequence[str]) -> Repeat:
    """The layers' place from the block names of the model built at one layer and at two."""
    period = len(two) - len(one)
    if period < 1:
        raise ConfigError(
            f"the model has {len(one)} blocks at one layer and {len(two)} at two: its layers "
            "are not blocks of their own, so its profile cannot be tiled"
        )
    for prefix in range(len(one) - period + 1):
        layer = list(one[prefix : prefix + period])
        if (
            list(two[:prefix]) == list(one[:prefix])
            and list(two[prefix + period :]) == list(one[prefix:])
            and list(two[prefix : prefix + period]) == layer
        ):
            return Repeat(prefix=prefix, period=period)
    raise ConfigError(
        "the model's blocks at one and two layers do not differ by one repeated layer: its "
        "profile cannot be tiled"
    )


def layer_repeat(workload: Workload) -> Repeat:
    """Where `workload`'s layers sit among its blocks, from shapes-only builds at one layer
    and at two."""
    one = [block_name(b) for b in replace(workload, layers=1).build("meta")]
    two = [block_name(b) for b in replace(workload, layers=2).build("meta")]
    return repeat_of(one, two)


def tiled(profile: Profile, measured: int, layers: int, repeat: Repeat) -> Profile:
    """`profile`, measured at `measured` layers, as the model at `layers`: the last measured
    layer's blocks stand for every layer past the measured ones (its tensor-parallel
    readings likewise)."""
    if layers < measured:
        raise ConfigError(
            f"tiling goes up from the {measured} layers measured, not down to {layers}: "
            "profile the smaller model itself"
        )
    workload = {**profile.workload, "layers": layers} if profile.workload else {}
    return replace(
        profile,
        blocks=_tile(profile.blocks, measured, layers, repeat),
        tensor_parallel={
            d: _tile(bs, measured, layers, repeat) for d, bs in profile.tensor_parallel.items()
        },
        workload=workload,
        tiled=f"measured at {measured} layers, tiled to {layers}",
    )


def _tile(
    blocks: Sequence[BlockProfile], measured: int, layers: int, repeat: Repeat
) -> tuple[BlockProfile, ...]:
    tail = len(blocks) - repeat.prefix - measured * repeat.period
    if measured < 1 or tail < 0:
        raise ConfigError(
            f"a profile of {len(blocks)} blocks cannot hold {measured} layers of "
            f"{repeat.period} blocks after {repeat.prefix}"
        )
    end = len(blocks) - tail
    head = list(blocks[:end])
    last = blocks[end - repeat.period : end]
    extra = [b for _ in range(layers - measured) for b in last]
    return tuple(replace(b, index=i) for i, b in enumerate(head + extra + list(blocks[end:])))
