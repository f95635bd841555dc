"""A GPT-style decoder (nanoGPT's shape) and a stack of torch's TransformerEncoderLayer.

GPT blocks: embedding, `layers` transformer blocks, final norm + head. The encoder stack is
the GPT anchor workload (docs/benchmarks.md): it takes embeddings and predicts a same-shape target.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pipecast.errors import ConfigError
from pipecast.values.data.spec import DatasetSpec

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""Attention of queries, keys and values (B, nh, T, hs) -> (B, nh, T, hs)."""


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Each position attends to itself and the positions before it."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Embedding(nn.Module):
    """Token plus learned position embedding: (B, T) ids -> (B, T, C)."""

    def __init__(self, vocab: int, seq_len: int, width: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(seq_len, width)
        self.positions: torch.Tensor | None = None
        """The sequence position of each column of the ids; None: 0 to T-1. Context
        parallelism hands a rank two chunks of each sequence (runtime/context.py)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = self.positions
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device)
        out: torch.Tensor = self.token(ids) + self.position(positions)
        return out


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention through scaled_dot_product_attention. The query, key and
    value projections are separate and the heads are counted from the projections' width,
    so a tensor-parallel plan can shard each projection column-wise by whole heads (a fused
    [q|k|v] projection sharded so would hand a rank q and half of k)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.attend: Attend = causal_attention
        """Context parallelism puts one here that gathers the other ranks' keys and values
        (runtime/context.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # (B, nh, T, hs), nh the heads this rank holds
        q, k, v = (
            z(x).view(b, t, -1, self.head_dim).transpose(1, 2) for z in (self.q, self.k, self.v)
        )
        y = self.attend(q, k, v)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return out


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(F.gelu(self.up(x)))
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class Head(nn.Module):
    """Final norm and projection to vocabulary logits: (B, T, C) -> (B, T, V)."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.out(self.ln(x))
        return logits


def _check_heads(width: int, heads: int) -> None:
    if heads < 1 or width % heads:
        raise ConfigError(f"width {width} must be divisible by heads {heads}")


def gpt(spec: DatasetSpec, *, layers: int = 8, width: int = 512, heads: int = 8) -> nn.Sequential:
    """GPT decoder over `spec`'s tokens: 1 + `layers` + 1 blocks."""
    _check_heads(width, heads)
    seq_len, vocab = spec.sample_shape[0], spec.num_classes
    blocks: list[nn.Module] = [Embedding(vocab, seq_len, width)]
    blocks += [Block(width, heads) for _ in range(layers)]
    blocks.append(Head(width, vocab))
    return nn.Sequential(*blocks)


def encoder_stack(
    spec: DatasetSpec, *, layers: int = 24, heads: int = 16, ffn: int = 0
) -> nn.Sequential:
    """`layers` x nn.TransformerEncoderLayer(pre-norm, GELU, no dropout) on `spec`'s
    embeddings (B, T, D); `ffn` defaults to 4 x D. The GPT anchor workload is D=2048,
    heads=16, 24 layers."""
    width = spec.sample_shape[-1]
    _check_heads(width, heads)
    return nn.Sequential(
        *[
            nn.TransformerEncoderLayer(
                width,
                heads,
                dim_feedforward=ffn or 4 * width,
                dropout=0.0,
                batch_first=True,
                norm_first=True,
                activation="gelu",
            )
            for _ in range(layers)
        ]
    )
