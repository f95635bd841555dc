"""A stage's backward for one micro-batch: whole (BW) or split into B and W, on pipecast's
own autograd split, or on plain autograd calls where torch's FSDP or tensor parallelism runs
the blocks (pipecast.runtime.mesh_backward); PipeDream's update after each BW."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipecast.runtime import mesh_backward
from pipecast.runtime.backward import (
    Cut,
    WeightWork,
    backward_full,
    backward_input,
    backward_input_segments,
)
from pipecast.runtime.mesh_backward import MeshWeights
from pipecast.runtime.stage import StageModule
from pipecast.values.plan.action import Action


@dataclass
class Micro:
    """One micro-batch of a stage between its forward and its last backward."""

    leaf: torch.Tensor | None
    out: torch.Tensor | None
    weights: dict[str, torch.Tensor] | None = None
    cuts: list[Cut] = field(default_factory=list)
    works: list[WeightWork] = field(default_factory=list)
    mesh_weights: MeshWeights | None = None
    """A meshed stage's W (pipecast.runtime.mesh_backward)."""


def run_backward(
    a: Action, st: StageModule, micro: Micro, grad: torch.Tensor | None, *, async_updates: bool
) -> torch.Tensor | None:
    """The backward `a` (BW, or B keeping what W needs) of one micro-batch on stage `st`;
    its input's gradient. PipeDream (`async_updates`) steps the stage after each BW."""
    assert micro.out is not None
    if st.meshed:
        return _mesh_backward(a, st, micro, grad)
    params = list(micro.weights.values()) if micro.weights is not None else st.params
    if a.kind == "BW":
        grad_in = backward_full(micro.out, grad, micro.leaf, params)
        if async_updates:
            _async_update(st, micro)
        micro.out = micro.leaf = None
        return grad_in
    if micro.cuts:
        grad_in, micro.works = backward_input_segments(
            micro.out, grad, micro.leaf, micro.cuts, st.part_params
        )
    else:
        grad_in, work = backward_input(micro.out, grad, micro.leaf, params)
        micro.works = [work]
    micro.out = micro.leaf = None
    micro.cuts = []
    return grad_in


def _mesh_backward(
    a: Action, st: StageModule, micro: Micro, grad: torch.Tensor | None
) -> torch.Tensor | None:
    """A meshed stage's BW, or B keeping what W needs (pipecast.runtime.mesh_backward)."""
    assert micro.out is not None
    if a.kind == "BW":
        grad_in = mesh_backward.backward_whole(micro.out, grad, micro.leaf)
    else:
        grad_in, micro.mesh_weights = mesh_backward.backward_input(
            micro.out, grad, micro.leaf, st.module
        )
    micro.out = micro.leaf = None
    return grad_in


def _async_update(st: StageModule, micro: Micro) -> None:
    """PipeDream: apply this micro-batch's gradient (taken on its stashed weights)."""
    assert micro.weights is not None
    named = dict(st.module.named_parameters())
    for name, stashed in micro.weights.items():
        named[name].grad = stashed.grad
    st.step()
    st.zero_grad(set_to_none=True)
    st.version += 1
    micro.weights = None
