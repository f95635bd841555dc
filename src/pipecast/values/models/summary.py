"""Per-block table of a model: output shape, parameters and forward FLOPs per sample.

Shapes and FLOPs come from running the model on the meta device under PyTorch's
FlopCounterMode, so even ResNet-152 at 512x512 is summarised in about a second with no
memory and no GPU.

The blocks run a batch of two, not one, and the FLOPs are halved. The model is in training
mode (as it will be profiled and trained), where batch norm takes its statistics over the
batch and the spatial positions: after a network's last downsampling there may be one
position (ResNet on 32x32 images ends at 1x1), and one sample then leaves one value per
channel, whose unbiased variance divides by zero. Switching to eval mode would not help a
captured model, whose exported graph has the training flag written into its batch-norm
calls; two samples is what `capture` exports with, for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pipecast.errors import ShapeError
from pipecast.values.data.spec import DatasetSpec

SAMPLES = 2
"""The batch the blocks run: two, so that batch norm has two values per channel even where
one spatial position is left (see the module's docstring)."""


@dataclass(frozen=True, slots=True)
class BlockSummary:
    index: int
    name: str
    output_shape: tuple[int, ...]
    """Output shape for one sample (batch dimension dropped)."""
    params: int
    flops: int
    """Forward FLOPs for one sample."""


def example_input(spec: DatasetSpec, batch: int, device: str | torch.device) -> torch.Tensor:
    shape = (batch, *spec.sample_shape)
    if spec.input_kind == "tokens":
        return torch.zeros(shape, dtype=torch.int64, device=device)
    return torch.empty(shape, device=device)


def block_name(block: nn.Module) -> str:
    return type(block).__name__


def summarize(model: nn.Sequential, spec: DatasetSpec) -> list[BlockSummary]:
    """One row per block; raises ShapeError naming the block that rejects its input."""
    meta = _to_meta(model)
    x = example_input(spec, SAMPLES, "meta")
    rows = []
    for index, block in enumerate(meta):
        in_shape = tuple(x.shape)
        try:
            with FlopCounterMode(display=False) as counter:
                y = block(x)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise ShapeError(
                f"block {index} ({block_name(block)}) fails on input of shape {in_shape}: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        if not isinstance(y, torch.Tensor):
            raise ShapeError(
                f"block {index} ({block_name(block)}) returns {type(y).__name__}; pipeline "
                "blocks must return one tensor"
            )
        params = sum(p.numel() for p in block.parameters())
        rows.append(
            BlockSummary(
                index,
                block_name(block),
                tuple(y.shape[1:]),
                params,
                int(counter.get_total_flops()) // SAMPLES,  # every counted op scales with it
            )
        )
        x = y
    return rows


def _to_meta(model: nn.Sequential) -> nn.Sequential:
    """The model on the meta device: as is if already there, else a copy (the user's model
    is left untouched)."""
    if all(p.is_meta for p in model.parameters()):
        return model
    import copy

    return copy.deepcopy(model).to("meta")
