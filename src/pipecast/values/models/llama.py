"""A Llama-style decoder (Llama 3's shape, as torchtitan's llama3 model builds it).

Blocks: token embedding, `layers` decoder layers, final RMSNorm + head. A layer is
x + attn(norm(x)) then x + mlp(norm(x)): RMSNorm, grouped-query causal attention with
rotary position embedding (`heads` query heads, `kv_heads` key/value heads, each key/value
head shared by heads / kv_heads query heads), and a SwiGLU MLP, w2(silu(w1 x) * w3 x), with
no biases anywhere. The query, key, value and output projections are separate Linears named
as the zoo GPT's (attn.q, attn.k, attn.v, attn.proj), so tensor parallelism shards them by
whole heads with the same plan (tensor_plans.py), and the MLP's w1 and w3 column-wise, w2
row-wise.

Llama 3.1 8B is width 4096, 32 layers, 32 heads, 8 key/value heads, FFN 14336, vocabulary
128256; 70B: 8192, 80, 64, 8, 28672; 405B: 16384, 126, 128, 8, 53248 (Meta's model card,
torchtitan's llama3 configs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipecast.errors import ConfigError
from pipecast.values.data.spec import DatasetSpec

ROPE_THETA = 500_000.0
"""Llama 3's rotary base."""


def default_ffn(width: int) -> int:
    """Llama's feed-forward width where none is given: 8/3 x width (SwiGLU's three
    matrices then hold as many weights as a 4 x width GELU MLP's two), rounded up to a
    multiple of 256."""
    return -(-8 * width // 3 // 256) * 256


def rotate(x: torch.Tensor, theta: float = ROPE_THETA) -> torch.Tensor:
    """Rotary position embedding of (B, nh, T, hs) queries or keys: each pair of channels
    (i, i + hs/2) turned by position x theta^(-2i/hs) (the rotate-half form of Hugging
    Face's Llama; torchtitan's interleaved pairs differ by a fixed permutation of the
    projection's weights, with the same cost)."""
    t, hs = x.shape[-2], x.shape[-1]
    inv_freq = theta ** -(torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs)
    angles = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inv_freq)
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(x.dtype)  # (T, hs)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(x.dtype)
    first, second = x[..., : hs // 2], x[..., hs // 2 :]
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class GroupedQueryAttention(nn.Module):
    """Causal attention with `heads` query heads and `kv_heads` key/value heads. The
    heads are counted from the projections' widths over `head_dim`, so a rank that holds
    a whole-head shard of each projection runs the same forward on its own heads."""

    def __init__(self, width: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.q = nn.Linear(width, heads * self.head_dim, bias=False)
        self.k = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(heads * self.head_dim, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # q (B, nh, T, hs), k and v (B, nkv, T, hs): the heads this rank holds
        q, k, v = (
            z(x).view(b, t, -1, self.head_dim).transpose(1, 2) for z in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(
            rotate(q), rotate(k), v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1]
        )
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return out


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): three Linears without biases, width -> ffn -> width."""

    def __init__(self, width: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(width, ffn, bias=False)
        self.w3 = nn.Linear(width, ffn, bias=False)
        self.w2 = nn.Linear(ffn, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class LlamaBlock(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(width, eps=1e-5)
        self.attn = GroupedQueryAttention(width, heads, kv_heads)
        self.mlp_norm = nn.RMSNorm(width, eps=1e-5)
        self.mlp = SwiGLU(width, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class LlamaEmbedding(nn.Module):
    """Token embedding alone (positions enter through the rotary embedding): (B, T) ids
    -> (B, T, C)."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.token(ids)
        return out


class LlamaHead(nn.Module):
    """Final RMSNorm and projection to vocabulary logits: (B, T, C) -> (B, T, V)."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(width, eps=1e-5)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.out(self.norm(x))
        return logits


def check_llama_heads(width: int, heads: int, kv_heads: int) -> None:
    """Heads that split the width evenly, and key/value heads that each serve the same
    number of query heads."""
    if heads < 1 or width % heads:
        raise ConfigError(f"width {width} must be divisible by heads {heads}")
    if kv_heads < 1 or heads % kv_heads:
        raise ConfigError(
            f"heads {heads} must be divisible by key/value heads {kv_heads} (each key/value "
            "head serves as many query heads): give --kv-heads a divisor of --heads"
        )


def llama(
    spec: DatasetSpec,
    *,
    layers: int = 8,
    width: int = 512,
    heads: int = 8,
    kv_heads: int = 0,
    ffn: int = 0,
) -> nn.Sequential:
    """Llama decoder over `spec`'s tokens: 1 + `layers` + 1 blocks; `kv_heads` 0 is
    `heads` (no grouping), `ffn` 0 is default_ffn(width)."""
    kv_heads = kv_heads or heads
    check_llama_heads(width, heads, kv_heads)
    ffn = ffn or default_ffn(width)
    vocab = spec.num_classes
    blocks: list[nn.Module] = [LlamaEmbedding(vocab, width)]
    blocks += [LlamaBlock(width, heads, kv_heads, ffn) for _ in range(layers)]
    blocks.append(LlamaHead(width, vocab))
    return nn.Sequential(*blocks)
