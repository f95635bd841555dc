"""The block table of a model whose batch norm is left with one spatial position."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecast.values.data.registry import get_spec
from pipecast.values.models import Workload, summarize
from pipecast.values.models.capture import capture

MNIST = get_spec("mnist")


class DownToOnePixel(nn.Module):
    """A 3x3 convolution of stride 28 takes a 28x28 image to 1x1, then batch norm, as a
    ResNet on 32x32 images ends: one position per channel for the norm's statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=28)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


def test_a_captured_batch_norm_at_one_pixel_is_summarised() -> None:
    """The captured graph calls batch norm in training mode (the flag is in the graph, so
    eval() cannot reach it); one sample would divide by zero in its unbiased variance."""
    with torch.device("meta"):
        blocks = capture(DownToOnePixel(), MNIST, name="one-pixel")
    rows = summarize(blocks, MNIST)
    assert rows[-1].output_shape == (10,)
    # per sample, by hand: the conv's 4 outputs of 9 multiply-adds, the head's 4 x 10
    assert sum(r.flops for r in rows) == 2 * 4 * 9 + 2 * 4 * 10
    assert sum(r.params for r in rows) == (4 * 9 + 4) + 2 * 4 + (4 * 10 + 10)


def test_flops_per_sample_match_one_sample_run_by_hand() -> None:
    """FLOPs are counted on two samples and halved: equal to the count for one."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    rows = summarize(model, MNIST)
    assert [r.flops for r in rows] == [0, 2 * 784 * 32, 0, 2 * 32 * 10]
    assert [r.output_shape for r in rows] == [(784,), (32,), (32,), (10,)]


def test_torchvision_resnet18_on_cifar10_is_summarised() -> None:
    pytest.importorskip("torchvision")
    workload = Workload(model="torchvision:resnet18", dataset="cifar10")
    rows = summarize(workload.build("meta"), workload.spec)
    assert rows[-1].output_shape == (10,)
    assert sum(r.params for r in rows) == 11_181_642  # torchvision's resnet18, 10 classes
