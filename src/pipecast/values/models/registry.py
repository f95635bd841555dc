"""Zoo models by name, each built for a data set's input shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import nn

from pipecast.errors import ShapeError, UnknownNameError
from pipecast.values.data.spec import DatasetSpec, InputKind
from pipecast.values.models.gpt import encoder_stack, gpt
from pipecast.values.models.lenet import lenet5
from pipecast.values.models.llama import llama
from pipecast.values.models.mobilenet import mobilenet_v2
from pipecast.values.models.resnet import resnet
from pipecast.values.models.vgg import vgg

Builder = Callable[..., nn.Sequential]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    build: Builder
    """build(spec, **options) -> nn.Sequential of blocks."""
    takes: InputKind
    default_dataset: str
    options: tuple[str, ...]
    """Keyword options the builder accepts (e.g. layers, width, heads)."""
    description: str


ZOO: dict[str, ModelEntry] = {
    e.name: e
    for e in [
        ModelEntry("lenet5", lenet5, "image", "mnist", (), "LeNet-5, 5 weight layers"),
        ModelEntry("vgg11", partial(vgg, "vgg11"), "image", "imagenet", (), "VGG-11"),
        ModelEntry("vgg16", partial(vgg, "vgg16"), "image", "imagenet", (), "VGG-16, 40 layers"),
        ModelEntry("resnet18", partial(resnet, "resnet18"), "image", "imagenet", (), "ResNet-18"),
        ModelEntry("resnet50", partial(resnet, "resnet50"), "image", "imagenet", (), "ResNet-50"),
        ModelEntry(
            "resnet152", partial(resnet, "resnet152"), "image", "imagenet", (), "ResNet-152"
        ),
        ModelEntry("mobilenetv2", mobilenet_v2, "image", "imagenet", (), "MobileNetV2"),
        ModelEntry(
            "gpt",
            gpt,
            "tokens",
            "tokens",
            ("layers", "width", "heads"),
            "GPT-style decoder: embedding, transformer blocks, norm + head",
        ),
        ModelEntry(
            "llama",
            llama,
            "tokens",
            "tokens",
            ("layers", "width", "heads", "kv_heads", "ffn"),
            "Llama-style decoder: RMSNorm, grouped-query attention with rotary positions, "
            "SwiGLU MLP",
        ),
        ModelEntry(
            "transformer",
            encoder_stack,
            "embeddings",
            "embeddings",
            ("layers", "heads", "ffn"),
            "stack of nn.TransformerEncoderLayer (the GPT anchor workload)",
        ),
    ]
}


def model_names() -> list[str]:
    return list(ZOO)


def get_entry(name: str) -> ModelEntry:
    if name not in ZOO:
        raise UnknownNameError("model", name, model_names())
    return ZOO[name]


def build_zoo_model(name: str, spec: DatasetSpec, **options: int) -> nn.Sequential:
    """Zoo model `name` for data set `spec`; options the model does not take are ignored."""
    entry = get_entry(name)
    if entry.takes != spec.input_kind:
        wanted = {"image": "an image data set", "tokens": "'tokens'", "embeddings": "'embeddings'"}
        raise ShapeError(
            f"model '{name}' takes {entry.takes} inputs but dataset '{spec.name}' gives "
            f"{spec.describe()}: use {wanted[entry.takes]}"
        )
    kwargs = {k: v for k, v in options.items() if k in entry.options and v}
    return entry.build(spec, **kwargs)
