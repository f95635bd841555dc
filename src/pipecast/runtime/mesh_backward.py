"""The backward of a stage torch's FSDP or tensor parallelism runs, through plain autograd
calls, whole or split into B and W.

FSDP gathers a unit's weights as its forward starts and hands autograd the gathered copies;
its hooks reduce-scatter the gradients autograd accumulates into them, and a DTensor's
gradient is a DTensor. pipecast's own split (backward.py) writes W's gradients by hand into
the parameters it was given, which FSDP's hooks would not see, so a meshed stage's B asks
autograd for its input's gradient alone, keeping the graph, and its W asks for the
parameters' as the module holds them at that moment (the gathered copies, which FSDP keeps
until the step's last backward; runtime/sharding.py). W walks the graph from the output
again: slower than pipecast's own split, and correct.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def _seed(output: torch.Tensor, grad_output: torch.Tensor | None) -> torch.Tensor:
    return torch.ones_like(output) if grad_output is None else grad_output


def backward_whole(
    output: torch.Tensor, grad_output: torch.Tensor | None, leaf: torch.Tensor | None
) -> torch.Tensor | None:
    """BW: every gradient accumulated by autograd (and FSDP's hooks); the input's, if any."""
    if not output.requires_grad:
        return None
    torch.autograd.backward(output, _seed(output, grad_output))
    if leaf is None or not leaf.requires_grad:
        return None
    grad, leaf.grad = leaf.grad, None
    return grad


@dataclass
class MeshWeights:
    """What W needs: the output, its gradient and the module whose parameters it asks for."""

    output: torch.Tensor
    grad_output: torch.Tensor
    module: nn.Module

    def run(self) -> None:
        """W: the parameters' gradients, as the module holds them now."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        if params:
            torch.autograd.backward(self.output, self.grad_output, inputs=params)


def backward_input(
    output: torch.Tensor,
    grad_output: torch.Tensor | None,
    leaf: torch.Tensor | None,
    module: nn.Module,
) -> tuple[torch.Tensor | None, MeshWeights | None]:
    """B: the input's gradient now, keeping the graph for W; without an input that needs a
    gradient, B is the whole backward and W has nothing to do."""
    if leaf is None or not leaf.requires_grad:
        backward_whole(output, grad_output, None)
        return None, None
    seed = _seed(output, grad_output)
    (grad,) = torch.autograd.grad(output, leaf, seed, retain_graph=True)
    return grad, MeshWeights(output, seed, module)
