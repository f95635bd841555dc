"""A model's forward FLOPs per sample, block by block, counted by torch's own counter.

[Note: how FLOPs are counted]
torch.utils.flop_counter.FlopCounterMode counts the matrix products, convolutions and
attention that a forward dispatches, two FLOPs per multiply-add, from their shapes alone;
elementwise work (norms, activations, softmax outside fused attention, the loss) is left out,
as the field's convention leaves it out. Each block runs once on the meta device with its
parameters and buffers swapped for shapes-only copies (torch.func.functional_call), so
counting takes no memory and no compute, and a model on a GPU is not touched. One sample is
counted: every op the counter sees is linear in the batch. Attention is counted whole
(scaled_dot_product_attention with is_causal counts the full T x T products, as Megatron-LM's
formula does: Narayanan et al., SC21, arXiv 2104.04473, appendix: 24 B s h^2 + 4 B s^2 h per
layer's forward). docs/flops.md has the rule for a step and for MFU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pipecast.errors import PipecastError
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import Profile

COUNT_FAILURES = (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError)
"""What a block that cannot run on the meta device raises (a data-dependent shape, a tensor
kept outside its parameters and buffers): its model goes uncounted, never unprofiled."""


def forward_flops(
    blocks: Sequence[nn.Module], spec: DatasetSpec, *, batch: int = 1
) -> tuple[int, ...] | None:
    """Each block's forward FLOPs for `batch` samples of `spec` (None: a block does not run
    on the meta device, and nothing is counted)."""
    x = _meta_batch(spec, batch)
    counts = []
    try:
        for block in blocks:
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                x = torch.func.functional_call(block, _meta_state(block), (x,))
            counts.append(int(counter.get_total_flops()))
    except COUNT_FAILURES:
        return None
    return tuple(counts)


def workload_flops(workload: Workload) -> tuple[int, ...] | None:
    """forward_flops of `workload`'s blocks, built shapes only (None: not countable)."""
    try:
        blocks = list(workload.build("meta"))
    except (PipecastError, *COUNT_FAILURES):
        return None
    return forward_flops(blocks, workload.spec)


def with_forward_flops(profile: Profile, counts: Sequence[int] | None) -> Profile:
    """`profile` with each block's BlockProfile.forward_flops set from `counts` (itself
    where `counts` is None or does not match its blocks one to one)."""
    if counts is None or len(counts) != profile.num_blocks:
        return profile
    blocks = tuple(replace(b, forward_flops=n) for b, n in zip(profile.blocks, counts, strict=True))
    return replace(profile, blocks=blocks)


def counted(profile: Profile) -> Profile:
    """`profile` with its forward FLOPs: its own where it has them, else counted from the
    workload it names (profiles taken before the profiler counted them, the shipped ones
    among them); unchanged where neither is at hand."""
    if profile.forward_flops is not None or not profile.workload:
        return profile
    try:
        workload = Workload.from_dict(profile.workload)
    except (PipecastError, TypeError, ValueError):
        return profile
    return with_forward_flops(profile, workload_flops(workload))


def _meta_batch(spec: DatasetSpec, batch: int) -> torch.Tensor:
    """`batch` samples of `spec`'s shape on the meta device (token ids, else fp32 values)."""
    dtype = torch.int64 if spec.input_kind == "tokens" else torch.float32
    return torch.empty((batch, *spec.sample_shape), dtype=dtype, device="meta")


def _meta_state(block: nn.Module) -> dict[str, torch.Tensor]:
    """Shapes-only copies of `block`'s parameters and buffers, floating ones in fp32 (the
    count does not depend on the precision; one precision keeps the sample and the
    weights agreeing)."""
    state = {**dict(block.named_parameters()), **dict(block.named_buffers())}
    return {
        name: torch.empty(
            t.shape, device="meta", dtype=torch.float32 if t.is_floating_point() else t.dtype
        )
        for name, t in state.items()
    }
