"""Context parallelism: the ranks of a context group split each sequence between them.

torch's own engine (torch.distributed.tensor.experimental.context_parallel) handles only
the CUDA attention kernels (flash, memory-efficient, cuDNN): on CPU ranks SDPA dispatches
aten._scaled_dot_product_flash_attention_for_cpu, which it has no rule for
("does not have a sharding strategy registered", torch 2.14). So pipecast runs the form
Llama 3 trained with (Llama 3 paper, section 3.3.2), the same on gloo and NCCL:

- the sequence is cut into 2 x cp chunks and rank c holds chunks c and 2cp-1-c, so every
  rank holds as many early positions (little to attend to) as late ones (much): under a
  causal mask their attention costs the same;
- each attention layer all-gathers the keys and values of the whole sequence and computes
  attention for its own queries only, masked by their true positions; the all-gather's
  backward reduce-scatters the keys' and values' gradients to their ranks (torch's
  functional collectives give both);
- each rank takes the same positions of the position embedding and of the targets; its loss
  is the mean over its tokens, weighted so the group's sum is the mean over all of them;
  the weights' gradients are summed over the context ranks as over data-parallel replicas.

The blocks themselves are the zoo GPT's (values/models/gpt.py): its embedding reads
positions from `Embedding.positions` and its attention calls `CausalSelfAttention.attend`,
which `apply` sets. A model without them has no attention over a sequence to split.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipecast.errors import ConfigError
from pipecast.runtime.channels import cached_group
from pipecast.values.models.gpt import CausalSelfAttention, Embedding
from pipecast.values.parallel import Layout


def check(model: nn.Module, seq_len: int, degree: int) -> None:
    """A one-line error where `degree` ranks cannot split `model`'s sequences."""
    if degree == 1:
        return
    if not any(isinstance(m, CausalSelfAttention) for m in model.modules()):
        raise ConfigError(
            f"context parallelism (degree {degree}) splits the sequence of a model's causal "
            "attention and this model has none the runtime can split (the zoo's gpt has): "
            "leave --context-parallel out"
        )
    if seq_len % (2 * degree):
        raise ConfigError(
            f"context parallelism over {degree} ranks cuts each sequence into 2 x {degree} "
            f"equal chunks, and the sequence length {seq_len} does not divide by "
            f"{2 * degree}: use a sequence length that does, or another degree"
        )


def positions(seq_len: int, degree: int, rank: int) -> torch.Tensor:
    """The sequence positions context rank `rank` of `degree` holds, in its order: chunk
    `rank` then chunk 2 x degree - 1 - `rank` of 2 x degree equal chunks."""
    size = seq_len // (2 * degree)
    early = torch.arange(rank * size, (rank + 1) * size)
    late = torch.arange((2 * degree - 1 - rank) * size, (2 * degree - rank) * size)
    return torch.cat([early, late])


def mask(seq_len: int, degree: int, rank: int) -> torch.Tensor:
    """Which keys each of `rank`'s queries may attend to, (T/degree, T) booleans: the keys
    in the order the all-gather lays them out (rank 0's positions, then rank 1's, ...), a
    key allowed where its position is at most the query's."""
    queries = positions(seq_len, degree, rank)
    keys = torch.cat([positions(seq_len, degree, r) for r in range(degree)])
    return keys[None, :] <= queries[:, None]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup,
    degree: int,
    rank: int,
) -> torch.Tensor:
    """Causal attention of this rank's queries (B, nh, T/degree, hs) over the whole
    sequence's keys and values, all-gathered from the group (the gather's backward
    reduce-scatters their gradients)."""
    from torch.distributed._functional_collectives import all_gather_single

    kv = torch.stack([k, v])  # (2, B, nh, T/cp, hs): one collective for both
    gathered = all_gather_single(kv, 0, group)  # (cp x 2, B, nh, T/cp, hs)
    keys, values = gathered.view(degree, *kv.shape).unbind(1)  # each (cp, B, nh, T/cp, hs)
    return attend_gathered(q, keys.unbind(0), values.unbind(0), rank=rank)


def attend_gathered(
    q: torch.Tensor,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    *,
    rank: int,
) -> torch.Tensor:
    """Attention of rank `rank`'s queries (B, nh, T/cp, hs) over every context rank's keys
    and values (one (B, nh, T/cp, hs) each, in rank order), masked by true positions."""
    degree = len(keys)
    k, v = torch.cat(list(keys), dim=2), torch.cat(list(values), dim=2)  # (B, nh, T, hs)
    allowed = mask(k.shape[2], degree, rank).to(q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def share(t: torch.Tensor, degree: int, rank: int) -> torch.Tensor:
    """This rank's columns of a batch of sequences (B, T, ...), copied out."""
    return t.index_select(1, positions(t.shape[1], degree, rank).to(t.device))


def context_group(layout: Layout, rank: int) -> dist.ProcessGroup | None:
    """`rank`'s context group (None: degree 1). Collective: every rank creates every
    group, in the same order."""
    if layout.context == 1:
        return None
    mine = None
    for r in range(layout.world):
        ranks = layout.group("context", r)
        if ranks[0] != r:
            continue
        group = cached_group(list(ranks), "context")
        if rank in ranks:
            mine = group
    return mine


def gradient_ranks(layout: Layout, pipeline: int, tensor: int) -> list[int]:
    """The ranks that sum one place's gradients: every replica's and every context rank's
    at pipeline rank `pipeline` and tensor-parallel rank `tensor`, in rank order."""
    return sorted(
        r
        for c in range(layout.context)
        for r in layout.replica_group(pipeline=pipeline, context=c, tensor=tensor)
    )


def apply(
    module: nn.Module,
    group: dist.ProcessGroup,
    *,
    degree: int,
    rank: int,
    seq_len: int,
    device: torch.device,
) -> None:
    """`module`'s embeddings read this rank's positions and its attention layers attend
    over the group's gathered keys and values."""
    for m in module.modules():
        if isinstance(m, Embedding):
            m.positions = positions(seq_len, degree, rank).to(device)
        elif isinstance(m, CausalSelfAttention):
            m.attend = partial(attend, group=group, degree=degree, rank=rank)
