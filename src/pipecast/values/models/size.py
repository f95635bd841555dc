"""How big a model is, read from its configuration, without building it whole.

A shapes-only build (the meta device) holds no tensor memory, but every block is still a
Python object built by Python code: a GPT of a million layers takes hours and gigabytes
that way. A model whose layer count is large is therefore built twice with one and two
layers, and the difference between the two is one layer's share: blocks and parameters
grow by it once per layer (a stack of equal layers, as every model that takes `layers`
is). A model of the layers it is asked for, up to EXACT_LAYERS, is built and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from pipecast.values.models.workload import Workload

EXACT_LAYERS = 64
"""Layer counts up to this are built (shapes only) and counted; beyond, extrapolated."""


@dataclass(frozen=True, slots=True)
class ModelSize:
    """A model's blocks and the bytes of its parameters and buffers, as built (fp32)."""

    blocks: int
    params: int
    """Parameters (each shared one once)."""
    bytes: int
    """Bytes of the parameters and buffers."""
    largest_block: int
    """Bytes of the largest block's parameters and buffers."""


def model_size(workload: Workload) -> ModelSize:
    """`workload`'s size: counted on a shapes-only build of it where it has at most
    EXACT_LAYERS layers, else from builds of one and two layers (the module's docstring)."""
    if workload.layers <= EXACT_LAYERS:
        return measure(workload.build("meta"))
    one, two = (measure(replace(workload, layers=n).build("meta")) for n in (1, 2))
    more = workload.layers - 1
    return ModelSize(
        blocks=one.blocks + more * (two.blocks - one.blocks),
        params=one.params + more * (two.params - one.params),
        bytes=one.bytes + more * (two.bytes - one.bytes),
        largest_block=max(one.largest_block, two.largest_block),
    )


def measure(model: nn.Sequential) -> ModelSize:
    """Count a built model's blocks, parameters and bytes."""
    params = {id(p): p for p in model.parameters()}
    held = [*params.values(), *model.buffers()]
    return ModelSize(
        blocks=len(model),
        params=sum(p.numel() for p in params.values()),
        bytes=sum(t.numel() * t.element_size() for t in held),
        largest_block=max((_bytes(block) for block in model), default=0),
    )


def _bytes(block: nn.Module) -> int:
    held = {id(t): t for t in (*block.parameters(), *block.buffers())}
    return sum(t.numel() * t.element_size() for t in held.values())
