"""What a data set gives a model: the shape and kind of one sample and of its target."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

TargetKind = Literal["class", "tokens", "regression"]
InputKind = Literal["image", "tokens", "embeddings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetSpec:
    """The shapes a data set feeds a model, independent of where the samples come from."""

    name: str
    """Registry name, e.g. 'cifar10'."""
    input_kind: InputKind
    """'image' (float C x H x W), 'tokens' (int64 ids, length T) or 'embeddings' (float T x D)."""
    sample_shape: tuple[int, ...]
    """Shape of one input sample, without the batch dimension."""
    target: TargetKind
    """'class' (one label), 'tokens' (next-token ids, length T) or 'regression' (same shape)."""
    num_classes: int
    """Classes for 'class', vocabulary size for 'tokens', 0 for 'regression'."""

    @property
    def target_shape(self) -> tuple[int, ...]:
        """Shape of one sample's target."""
        if self.target == "class":
            return ()
        if self.target == "tokens":
            return (self.sample_shape[0],)
        return self.sample_shape

    def target_bytes(self, itemsize: int) -> int:
        """Bytes of one sample's target: int64 labels or token ids, or `itemsize`-byte
        floats of the input's shape (regression)."""
        return math.prod(self.target_shape) * (itemsize if self.target == "regression" else 8)

    @property
    def image_size(self) -> int:
        """Height of an image sample (images are square here)."""
        return self.sample_shape[-1]

    @property
    def channels(self) -> int:
        return self.sample_shape[0]

    def describe(self) -> str:
        shape = "x".join(str(d) for d in self.sample_shape)
        if self.input_kind == "tokens":
            return (
                f"token sequences of length {self.sample_shape[0]}, vocabulary {self.num_classes}"
            )
        if self.input_kind == "embeddings":
            return f"float embeddings of shape {shape} (regression)"
        return f"images of shape {shape}, {self.num_classes} classes"
