"""Data sets by name: their specs, and where their samples come from."""

from __future__ import annotations

from pipecast.errors import ConfigError, UnknownNameError
from pipecast.values.data.spec import DatasetSpec

_IMAGE_SETS: dict[str, tuple[tuple[int, int, int], int, str]] = {
    "mnist": ((1, 28, 28), 10, "MNIST shape: 28x28 grey digits, 10 classes"),
    "digits": ((1, 28, 28), 10, "scikit-learn's 8x8 handwritten digits, real, brought to 28x28"),
    "cifar10": ((3, 32, 32), 10, "CIFAR-10 shape: 32x32 colour, 10 classes"),
    "imagenet": ((3, 224, 224), 1000, "ImageNet shape: 224x224 colour, 1000 classes"),
    "highres": ((3, 512, 512), 1000, "high resolution: 512x512 colour, 1000 classes"),
}

TRAINING_SAMPLES: dict[str, int] = {
    "mnist": 60_000,
    "digits": 1_797,
    "cifar10": 50_000,
    "imagenet": 1_281_167,
}
"""Samples in the training split of the data sets whose shapes these are (ILSVRC-2012 for
ImageNet): one epoch's worth. The synthetic sets have none."""

DEFAULT_EPOCH_SAMPLES = 50_000
"""An epoch for a data set without a known training split."""


def epoch_samples(name: str) -> int:
    """Samples in one epoch of data set `name`: its training split where there is one."""
    return TRAINING_SAMPLES.get(name, DEFAULT_EPOCH_SAMPLES)


DEFAULT_SEQ_LEN = 256
DEFAULT_VOCAB = 8192
DEFAULT_WIDTH = 512

DESCRIPTIONS: dict[str, str] = {
    **{name: desc for name, (_, _, desc) in _IMAGE_SETS.items()},
    "tokens": "token sequences (next-token prediction); --seq-len, --vocab",
    "embeddings": "float token embeddings with a same-shape regression target; --seq-len, --width",
}


def dataset_names() -> list[str]:
    return list(DESCRIPTIONS)


def get_spec(
    name: str,
    *,
    seq_len: int = DEFAULT_SEQ_LEN,
    vocab: int = DEFAULT_VOCAB,
    width: int = DEFAULT_WIDTH,
) -> DatasetSpec:
    """The spec of data set `name`; `seq_len`, `vocab`, `width` shape the sequence sets."""
    if name in _IMAGE_SETS:
        shape, classes, _ = _IMAGE_SETS[name]
        return DatasetSpec(
            name=name, input_kind="image", sample_shape=shape, target="class", num_classes=classes
        )
    for label, value in (("seq_len", seq_len), ("vocab", vocab), ("width", width)):
        if value < 1:
            raise ConfigError(f"{label} must be at least 1, got {value}")
    if name == "tokens":
        return DatasetSpec(
            name=name,
            input_kind="tokens",
            sample_shape=(seq_len,),
            target="tokens",
            num_classes=vocab,
        )
    if name == "embeddings":
        return DatasetSpec(
            name=name,
            input_kind="embeddings",
            sample_shape=(seq_len, width),
            target="regression",
            num_classes=0,
        )
    raise UnknownNameError("dataset", name, dataset_names())
