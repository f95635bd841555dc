"""The training loss that matches a data set's target kind."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipecast.values.data.spec import DatasetSpec


class ClassLoss:
    """Cross-entropy over class logits (B, C) or token logits (B, T, V)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if output.dim() == 3:  # (B, T, V) against (B, T)
            return F.cross_entropy(output.flatten(0, 1).float(), target.flatten())
        return F.cross_entropy(output.float(), target)


class RegressionLoss:
    """Mean squared error against a target of the output's shape."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output.float(), target.float())


def loss_for(spec: DatasetSpec) -> ClassLoss | RegressionLoss:
    """The loss a model trained on `spec` minimises (a picklable callable)."""
    return RegressionLoss() if spec.target == "regression" else ClassLoss()
