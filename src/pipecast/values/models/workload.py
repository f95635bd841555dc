"""Workload: a model and the data it trains on, as a small picklable value.

Every rank of a distributed run rebuilds its blocks from the same Workload, and profiles,
benchmarks and caches are keyed by it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import torch
from torch import nn

from pipecast.errors import ConfigError
from pipecast.values.data.registry import DEFAULT_SEQ_LEN, DEFAULT_VOCAB, DEFAULT_WIDTH, get_spec
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.models.registry import build_zoo_model, get_entry
from pipecast.values.models.sources import (
    build_source_model,
    check_source_model,
    is_source_path,
    library_of,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A model (zoo name or 'package.module:factory') and a data set, with their options."""

    model: str
    """Zoo name (see `pipecast models`), 'torchvision:NAME', 'timm:NAME', 'hf:TYPE' or
    'package.module:factory'."""
    dataset: str
    """Data set name (mnist, digits, cifar10, imagenet, highres, tokens, embeddings)."""
    seq_len: int = DEFAULT_SEQ_LEN
    """Sequence length of 'tokens' and 'embeddings'."""
    vocab: int = DEFAULT_VOCAB
    """Vocabulary of 'tokens'."""
    width: int = DEFAULT_WIDTH
    """Embedding width of 'embeddings' and of the GPT model."""
    layers: int = 0
    """Transformer layers (0: the model's default)."""
    heads: int = 0
    """Attention heads (0: the model's default)."""
    ffn: int = 0
    """Feed-forward width of 'transformer', 'llama' and 'hf:' models (0: the model's
    default: 4 x width, Llama's 8/3 x width)."""
    kv_heads: int = 0
    """Key/value heads of 'llama' and 'hf:' models, grouped-query attention (0: as many as
    heads)."""

    def __post_init__(self) -> None:
        """Sizes a model can have: lengths and widths of at least 1; layers, heads and the
        feed-forward width 0 (the model's default) or more."""
        sizes = {"seq_len": self.seq_len, "vocab": self.vocab, "width": self.width}
        defaults = {
            "layers": self.layers,
            "heads": self.heads,
            "ffn": self.ffn,
            "kv_heads": self.kv_heads,
        }
        for name, value in sizes.items():
            if value < 1:
                raise ConfigError(f"the workload's {name} must be at least 1, got {value}")
        for name, value in defaults.items():
            if value < 0:
                raise ConfigError(
                    f"the workload's {name} must be 0 (the model's default) or more, got {value}"
                )

    @property
    def spec(self) -> DatasetSpec:
        return get_spec(self.dataset, seq_len=self.seq_len, vocab=self.vocab, width=self.width)

    def build(self, device: str | torch.device | None = None) -> nn.Sequential:
        """The model's blocks, freshly initialised (seed the RNG first for equal weights);
        `device='meta'` builds shapes only, with no memory."""
        if device is not None:
            with torch.device(device):
                return self.build()
        spec = self.spec
        options = {
            "layers": self.layers,
            "width": self.width,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "ffn": self.ffn,
        }
        if is_source_path(self.model):
            return build_source_model(self.model, spec, **options)
        return build_zoo_model(self.model, spec, **options)

    def check(self) -> None:
        """A one-line error where the model cannot be made for the data set: found in a
        shapes-only build, without capturing a model that is not a list of blocks (see
        sources.check_source_model), so that a verb can refuse before it profiles."""
        if not is_source_path(self.model):
            self.build("meta")
            return
        check_source_model(
            self.model,
            self.spec,
            layers=self.layers,
            width=self.width,
            heads=self.heads,
            kv_heads=self.kv_heads,
            ffn=self.ffn,
        )

    def block_count(self) -> int:
        """How many blocks the model has: a shapes-only build, remembered per workload in
        this process (a captured model's build exports it, seconds each time, and a job
        counts its blocks in the launcher and again in every rank)."""
        return _block_count(self)

    def shapes(self) -> nn.Sequential:
        """A shapes-only build (device 'meta') to read, never to change: a captured model's
        remembered per workload in this process, as for block_count (a job reads it for its
        block count and its tensor-parallel split, in the launcher and in every rank); any
        other is built afresh, in milliseconds."""
        if is_source_path(self.model):
            return _captured_shapes(self)
        return self.build("meta")

    @property
    def key(self) -> str:
        """A stable, readable identity used for caches and result stores."""
        parts = [self.model, self.dataset]
        if self.spec.input_kind != "image":
            parts.append(f"T{self.seq_len}")
            parts.append(f"V{self.vocab}" if self.dataset == "tokens" else f"D{self.width}")
        if (
            self.model == "gpt"
            or library_of(self.model) == "hf"
            or (not is_source_path(self.model) and get_entry(self.model).options)
        ):
            parts += [f"L{self.layers}", f"H{self.heads}", f"W{self.width}", f"F{self.ffn}"]
            if self.kv_heads:  # only where given: keys of workloads before it stay as they were
                parts.append(f"KV{self.kv_heads}")
        return "-".join(parts)

    def to_dict(self) -> dict[str, object]:
        """Its fields; `kv_heads` only where given, so that a workload written before the
        field existed (a shipped profile's) still reads as the same workload."""
        out = asdict(self)
        if not self.kv_heads:
            del out["kv_heads"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Workload:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})  # type: ignore[arg-type]


@lru_cache(maxsize=64)
def _block_count(workload: Workload) -> int:
    return len(workload.shapes())


@lru_cache(maxsize=4)
def _captured_shapes(workload: Workload) -> nn.Sequential:
    return workload.build("meta")
