"""scikit-learn's handwritten digits (1,797 real 8x8 images), brought to MNIST's 28x28."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipecast.values.data.arrays import ArrayData


def load_digits_as_mnist() -> ArrayData:
    """The digits data set as float [N, 1, 28, 28] images (standardised) and int64 labels."""
    from sklearn.datasets import load_digits  # ships with scikit-learn; no download

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N,1,8,8)
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    images = (images - images.mean()) / images.std()
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    return ArrayData(images.contiguous(), labels)
