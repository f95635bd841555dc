"""Activation recomputation: what a recomputed forward keeps, and where its checkpoints sit.

'all' keeps only each checkpoint's input; 'selective' (Korthikanti et al. 2022, arXiv
2205.05198) keeps the outputs of the matrix products and of the attention (SAVED_OPS) as
well and runs again only the cheap ops between them: normalisations, activations, additions,
reshapes. Torch's engine does it: torch.utils.checkpoint with a selective context
(create_selective_checkpoint_contexts), whose policy saves SAVED_OPS' outputs and prefers
to recompute the rest.

Where the checkpoints sit. A stage of whole weights recomputed in full is one checkpoint
(StageModule._part); recomputed selectively, each block is one, so that the backward makes
one block's cheap ops again at a time and each block's input is kept (Korthikanti et al.'s
layout). A stage sharded by FSDP makes each block a checkpoint of its own
before fully_shard (`checkpoint_blocks`, as torchtitan wraps each transformer block): one
checkpoint around the whole sharded stage would run every block's forward again as the
backward begins, holding all of the stage's activations at once, as much as not recomputing
at all. Block by block, autograd runs a block's forward again just before that block's
backward, on the weights FSDP gathers for the backward anyway (with resharding after the
forward it gathers each unit again for its backward, recomputed or not: nothing more is
gathered). The checkpoints are torch's composable ones (torch.distributed._composable
.checkpoint), forward hooks on each block that leave its parameters' names as they are,
switched on for the micro-batches that recompute (`recomputing`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

_aten = torch.ops.aten
SAVED_OPS: frozenset[Any] = frozenset(
    op
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if (op := getattr(getattr(_aten, name, None), "default", None)) is not None
) | frozenset(
    op
    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")
    if (op := getattr(getattr(torch.ops._c10d_functional, name, None), "default", None)) is not None
)
"""The ops whose outputs selective recomputation keeps: matrix products (a Linear is an mm or
an addmm), convolutions and fused attention, and tensor parallelism's collectives. Running
them again would cost most of the forward's time (or its communication); the ops between
them cost little time and much memory."""


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def context_fn(recompute: str) -> Callable[[], tuple[Any, Any]]:
    """torch.utils.checkpoint's context_fn for `recompute`: selective's policy, or none."""
    if recompute == "selective":
        return functools.partial(create_selective_checkpoint_contexts, _policy)
    return noop_context_fn


def checkpoint_blocks(module: nn.Sequential, recompute: str) -> None:
    """Each block of `module` a checkpoint of its own (switched off until `recomputing`),
    kept as `recompute` says: call before fully_shard, so that FSDP's hooks wrap the
    checkpoint's."""
    from torch.distributed._composable.checkpoint_activation import checkpoint

    for block in module:
        checkpoint(block, context_fn=context_fn(recompute))
        checkpoint.state(block).enable_hook = False


@contextlib.contextmanager
def recomputing(module: nn.Sequential, on: bool) -> Iterator[None]:
    """Inside: the block checkpoints of `module` (checkpoint_blocks) recompute when `on`,
    else the blocks keep what they save."""
    from torch.distributed._composable.checkpoint_activation import checkpoint

    for block in module:
        checkpoint.state(block).enable_hook = on
    try:
        yield
    finally:
        for block in module:
            checkpoint.state(block).enable_hook = False
