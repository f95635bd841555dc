"""Models named by where they come from: 'torchvision:resnet50', 'timm:vit_base_patch16_224',
'hf:gpt2' and 'package.module:factory', each built with random weights (nothing is
downloaded) and captured into blocks unless it already is an nn.Sequential.

torchvision, timm and transformers are optional (`pip install pipecast[models]`): each is
imported only when a model asks for it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from types import ModuleType
from typing import Any

import torch
from torch import nn

from pipecast.errors import ConfigError, PipecastError
from pipecast.extras import require
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.models.capture import capture
from pipecast.values.models.user import as_sequential

LIBRARIES = {"torchvision": "torchvision", "timm": "timm", "hf": "transformers"}
DEFAULT_DATASET = {"torchvision": "imagenet", "timm": "imagenet", "hf": "tokens"}


def library_of(name: str) -> str | None:
    """'torchvision', 'timm' or 'hf' for a model named through one of them, else None."""
    prefix, sep, _ = name.partition(":")
    return prefix if sep and prefix in LIBRARIES else None


def is_source_path(name: str) -> bool:
    """Whether `name` is a 'library:model' or 'package.module:factory' (not a zoo name)."""
    return ":" in name


def file_stem(name: str) -> str:
    """`name` as it can stand in a file name ('hf:gpt2' -> 'hf_gpt2')."""
    return name.replace(":", "_")


def default_dataset(name: str) -> str:
    library = library_of(name)
    return DEFAULT_DATASET[library] if library else "mnist"


MODELS_EXTRA = "pip install 'pipecast[models]'"


def _import(library: str) -> ModuleType:
    return require(LIBRARIES[library], needed_by=f"--model {library}:...", install=MODELS_EXTRA)


class LogitsOnly(nn.Module):
    """A Hugging Face causal LM that maps token ids to logits (no cache, no loss)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=ids, use_cache=False).logits
        return logits


def hf_model(model_type: str, spec: DatasetSpec, **sizes: int) -> nn.Module:
    """A causal LM of `model_type` ('gpt2', 'llama', ...) from its default config, sized by
    `spec` (vocabulary, sequence length) and the sizes given (hf_config's)."""
    transformers = _import("hf")
    config = hf_config(model_type, spec, **sizes)
    return LogitsOnly(transformers.AutoModelForCausalLM.from_config(config))


HF_SIZES = (
    ("hidden_size", "width", "--width"),
    ("num_attention_heads", "heads", "--heads"),
    ("num_key_value_heads", "key/value heads", "--kv-heads"),
    ("intermediate_size", "feed-forward width", "--ffn"),
    ("num_hidden_layers", "layers", "--layers"),
    ("vocab_size", "vocabulary", "--vocab"),
    ("max_position_embeddings", "positions", "--seq-len"),
)
"""A Hugging Face config's sizes: its field, its name in words, the flag that sets it."""


def hf_sizes(model_type: str, spec: DatasetSpec, **options: int) -> str:
    """What hf:`model_type` is built at where that is not the model type's own
    configuration, in one line naming the flags that build its own ('' where it is)."""
    own = _default_config(model_type)
    built = hf_config(model_type, spec, **options)
    moved = []
    for field, words, flag in HF_SIZES:
        if getattr(built, field, None) != getattr(own, field, None):
            moved.append((words, flag, getattr(built, field), getattr(own, field)))
    if not moved:
        return ""
    now = ", ".join(f"{words} {value:,}" for words, _, value, _ in moved)
    was = ", ".join(f"{words} {value:,}" for words, _, _, value in moved)
    flags = " ".join(f"{flag} {value}" for _, flag, _, value in moved)
    return (
        f"hf:{model_type} is built at {now}, from pipecast's defaults for {spec.name}; its own "
        f"configuration has {was} ({flags})"
    )


def _default_config(model_type: str) -> Any:
    """The default configuration of a Hugging Face model type (offline, no download)."""
    transformers = _import("hf")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return transformers.AutoConfig.for_model(model_type)
    except ValueError:
        raise ConfigError(
            f"unknown Hugging Face model type '{model_type}' (e.g. gpt2, llama, mistral)"
        ) from None


def hf_config(
    model_type: str,
    spec: DatasetSpec,
    *,
    layers: int = 0,
    width: int = 0,
    heads: int = 0,
    kv_heads: int = 0,
    ffn: int = 0,
) -> Any:
    """`model_type`'s default configuration sized by `spec` (vocabulary, sequence length)
    and the options given, as hf_model builds it. A new width without `ffn` scales the
    feed-forward width to 4 x width, and new heads without `kv_heads` make as many
    key/value heads (the config's own would no longer fit); `ffn` and `kv_heads` set
    them as given (Llama 3's 14336 and 8 at width 4096)."""
    config = _default_config(model_type)
    if spec.input_kind != "tokens":
        raise ConfigError(f"hf:{model_type} takes token ids: use --dataset tokens")
    config.vocab_size = spec.num_classes
    config.max_position_embeddings = spec.sample_shape[0]
    for field, value in (
        ("num_hidden_layers", layers),
        ("hidden_size", width),
        ("num_attention_heads", heads),
    ):
        if value:
            setattr(config, field, value)
    if width and not heads and width % config.num_attention_heads:
        config.num_attention_heads = max(1, width // 64)  # heads of 64, as GPT-2's
        heads = config.num_attention_heads
    if (ffn or width) and hasattr(config, "intermediate_size"):
        config.intermediate_size = ffn or 4 * width
    if (kv_heads or heads) and hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = kv_heads or heads
    if (width or heads) and getattr(config, "head_dim", None):  # Llama's, Mistral's: fixed
        config.head_dim = config.hidden_size // config.num_attention_heads
    for token in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(config, token, None) is not None:
            setattr(config, token, 0)
    return config


def vision_model(library: str, name: str, spec: DatasetSpec) -> nn.Module:
    if spec.input_kind != "image":
        raise ConfigError(f"{library}:{name} takes images: use --dataset imagenet or cifar10")
    package = _import(library)
    classes = spec.num_classes
    if library == "torchvision":
        try:
            model: nn.Module = package.models.get_model(name, weights=None, num_classes=classes)
        except ValueError as exc:
            raise ConfigError(f"torchvision has no model '{name}': {exc}") from None
        return model
    if name not in package.list_models():
        raise ConfigError(f"timm has no model '{name}' (see timm.list_models())")
    try:
        size = spec.sample_shape[-1]
        built: nn.Module = package.create_model(name, num_classes=classes, img_size=size)
    except TypeError:  # a model without img_size
        built = package.create_model(name, num_classes=classes)
    return built


def call_factory(path: str, spec: DatasetSpec) -> object:
    """What the factory at 'package.module:function' returns (given the DatasetSpec if it
    takes an argument)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"model '{path}' must look like package.module:factory")
    if os.getcwd() not in sys.path:  # the user's own package, beside them (as uvicorn does)
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import '{module_name}' for --model {path}: {exc}") from None
    except Exception as exc:  # the user's module fails as it loads
        raise ConfigError(
            f"importing '{module_name}' for --model {path} raised {type(exc).__name__}: "
            f"{first_line(exc)}"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"'{module_name}' has no callable '{attr}' (from --model {path})")
    try:
        takes_spec = len(inspect.signature(factory).parameters) > 0
    except (TypeError, ValueError):
        takes_spec = False
    try:
        return factory(spec) if takes_spec else factory()
    except PipecastError:
        raise  # already one line that names the rule
    except Exception as exc:  # the user's code: whatever it raises is theirs to fix
        raise ConfigError(
            f"the model factory {path} raised {type(exc).__name__}: {first_line(exc)}"
        ) from None


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (its type where it has none)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:240]
    return "(no message)"


def as_blocks(model: object, spec: DatasetSpec, name: str) -> nn.Sequential:
    """An nn.Sequential (or list of modules) as it is; any other nn.Module captured."""
    if isinstance(model, nn.Module) and not isinstance(model, nn.Sequential):
        return capture(model, spec, name=name)
    return as_sequential(model, origin=name)


def build_source_model(name: str, spec: DatasetSpec, **options: int) -> nn.Sequential:
    """The blocks of `name` ('library:model' or 'package.module:factory') for `spec`."""
    return as_blocks(source_model(name, spec, **options), spec, name)


def check_source_model(name: str, spec: DatasetSpec, **options: int) -> None:
    """A one-line error where `name` makes no model for `spec` (an unknown name, a factory
    that raises or returns no module), found on the meta device and without capturing it
    (torch.export takes seconds for a large model)."""
    with torch.device("meta"):
        model = source_model(name, spec, **options)
    if not isinstance(model, nn.Module):
        as_sequential(model, origin=name)  # a list of modules passes; anything else raises


def source_model(name: str, spec: DatasetSpec, **options: int) -> object:
    """What `name` ('library:model' or 'package.module:factory') makes for `spec`, as it
    comes (an nn.Module, a list of modules, or whatever a factory returns)."""
    library = library_of(name)
    _, _, model_name = name.partition(":")
    if library == "hf":
        sizes = ("layers", "width", "heads", "kv_heads", "ffn")
        model: object = hf_model(model_name, spec, **{k: options.get(k, 0) for k in sizes})
    elif library is not None:
        model = vision_model(library, model_name, spec)
    else:
        model = call_factory(name, spec)
    return model
