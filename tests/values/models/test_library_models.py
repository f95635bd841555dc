"""Models named through a library ('torchvision:resnet18', 'timm:vit_tiny_patch16_224') and
built by pipecast's model sources for a data set's shapes: they classify into the data set's
classes, and their captured blocks compute what the library's own module computes.

Skipped where the library is not installed (pipecast[models] brings both)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pipecast.values.models.graph_blocks import GraphBlock
from pipecast.values.models.workload import Workload

CIFAR = "cifar10"  # 3 x 32 x 32, 10 classes: neither library's default shape or classes


def _torchvision_resnet18() -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    model: nn.Module = torchvision.models.resnet18(weights=None, num_classes=10)
    return model


def _timm_vit_tiny() -> nn.Module:
    timm = pytest.importorskip("timm")
    model: nn.Module = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32)
    return model


LIBRARY_MODELS: dict[str, Callable[[], nn.Module]] = {
    "torchvision:resnet18": _torchvision_resnet18,
    "timm:vit_tiny_patch16_224": _timm_vit_tiny,
}
"""pipecast's name -> the same model from the library itself, for CIFAR-10."""


@functools.cache
def _blocks(name: str) -> nn.Sequential:
    """Model `name` for CIFAR-10 through pipecast's sources, from seed 0 (built once: a
    capture takes seconds)."""
    pytest.importorskip(name.partition(":")[0])
    torch.manual_seed(0)
    return Workload(model=name, dataset=CIFAR).build()


@pytest.mark.parametrize("name", list(LIBRARY_MODELS))
def test_a_library_model_is_captured_for_the_data_sets_classes(name: str) -> None:
    blocks, workload = _blocks(name), Workload(model=name, dataset=CIFAR)
    assert len(blocks) > 1 and all(isinstance(b, GraphBlock) for b in blocks)
    x = torch.randn(3, *workload.spec.sample_shape)
    with torch.no_grad():
        out = blocks(x)
    assert out.shape == (3, workload.spec.num_classes) == (3, 10)


@pytest.mark.parametrize("name", list(LIBRARY_MODELS))
def test_captured_blocks_compute_what_the_library_module_computes(name: str) -> None:
    """The same seed gives the same weights: the blocks' forward (in training mode, as
    pipecast trains them: batch norm on the batch's statistics) and the gradients it gives
    the input are the library module's."""
    blocks, workload = _blocks(name), Workload(model=name, dataset=CIFAR)
    torch.manual_seed(0)
    original = LIBRARY_MODELS[name]()
    x = torch.randn(4, *workload.spec.sample_shape)
    outputs, grads = [], []
    for model in (blocks, original):
        leaf = x.clone().requires_grad_(True)
        out = model(leaf)
        out.square().sum().backward()
        outputs.append(out.detach())
        grads.append(leaf.grad)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
