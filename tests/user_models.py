"""Factories that tests import through --model tests.user_models:NAME."""

from __future__ import annotations

import torch
from torch import nn

from pipecast.values.data.spec import DatasetSpec


def tiny_mlp(spec: DatasetSpec) -> nn.Sequential:
    features = 1
    for d in spec.sample_shape:
        features *= d
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, spec.num_classes)
    )


def tiny_list() -> list[nn.Module]:
    return [nn.Flatten(), nn.Linear(784, 10)]


def not_a_model() -> int:
    return 3


class _Residual(nn.Module):
    """conv, norm, relu, conv, plus the input: two tensors cross any cut inside it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.GroupNorm(2, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.conv2(torch.relu(self.norm(self.conv1(x)))))


class ResidualNet(nn.Module):
    """A residual network written as a plain nn.Module (no nn.Sequential of blocks)."""

    def __init__(self, channels: int = 8, blocks: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, channels, 3, padding=1)
        self.stages = nn.ModuleList(_Residual(channels) for _ in range(blocks))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))


def residual_net(spec: DatasetSpec) -> nn.Module:
    return ResidualNet(classes=spec.num_classes)


def short_residual_net(spec: DatasetSpec) -> nn.Module:
    """Two residual blocks: too few single-tensor cuts, so some cuts pass two tensors."""
    return ResidualNet(blocks=2, classes=spec.num_classes)


def small_decoder(spec: DatasetSpec) -> nn.Module:
    """A 4-layer GPT-2 from its config, dropout off, tied embedding and head."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipecast.values.models.sources import LogitsOnly

    config = GPT2Config(
        n_layer=4,
        n_embd=64,
        n_head=4,
        vocab_size=spec.num_classes,
        n_positions=spec.sample_shape[0],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LogitsOnly(GPT2LMHeadModel(config))


def small_llama(spec: DatasetSpec) -> nn.Module:
    """A 2-layer Llama from its config with grouped-query attention (4 query heads of 8, 2
    key/value heads), untied: tensor parallelism splits it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipecast.values.models.sources import LogitsOnly

    config = LlamaConfig(
        vocab_size=spec.num_classes,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=spec.sample_shape[0],
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LogitsOnly(LlamaForCausalLM(config))


class MlpBlock(nn.Module):
    """LayerNorm, two Linears and a residual: what a transformer's MLP half does."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.tanh(self.up(self.norm(x))))
        return out


def residual_mlp(spec: DatasetSpec, width: int = 24) -> nn.Sequential:
    """A flatten and input projection, six identical residual blocks (one compiled graph
    serves them all), a head: the compiled-stage tests' model."""
    features = 1
    for d in spec.sample_shape:
        features *= d
    return nn.Sequential(
        nn.Sequential(nn.Flatten(), nn.Linear(features, width)),
        *[MlpBlock(width) for _ in range(6)],
        nn.Linear(width, spec.num_classes),
    )
