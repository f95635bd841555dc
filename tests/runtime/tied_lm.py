"""A tiny language model whose head is its embedding (tied), in plain torch: captured into
ten blocks, the tie between the first and the last (GraphBlock.tied)."""

from __future__ import annotations

import torch
from torch import nn

from pipecast.values.data.spec import DatasetSpec


class TiedLM(nn.Module):
    def __init__(self, vocab: int, width: int = 16, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Tanh())
            for _ in range(layers)
        )
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)  # (B, T, width)
        for layer in self.layers:
            h = h + layer(h)
        logits: torch.Tensor = self.head(h)  # (B, T, vocab)
        return logits


def tied_lm(spec: DatasetSpec) -> nn.Module:
    return TiedLM(spec.num_classes)
