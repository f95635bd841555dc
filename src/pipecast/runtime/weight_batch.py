"""W of several micro-batches as one (Plan.weight_batch; values.plan.weight_groups).

At small micro-batches a weight's gradient is a matrix product with few rows to sum over, and
the GPU runs it below its speed. Where a plan batches k micro-batches' W, each matrix product
that feeds a weight (a Linear's AddmmBackward0 or MmBackward0) takes the k micro-batches'
inputs and output gradients concatenated along their rows: one product sums over all of
them, added into .grad as the k would have been. The same input feeding several products
(a query, key and value projection) is concatenated once. Every other node (a LayerNorm, a
bias alone, a convolution, whatever the engine must run) takes the micro-batches one by
one, as W does, and so does a compiled block's weight-gradient code (traced for one
micro-batch's shapes). The gradients are the same sums, added in another order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.autograd.graph import Node

from pipecast.runtime.autograd_calls import on_engine_thread
from pipecast.runtime.backward import WeightWork, backward_weight, backward_weights
from pipecast.runtime.weight_grads import hooked, matmul_roles
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.weight_groups import weight_groups

Entry = tuple[Node, tuple[torch.Tensor | None, ...], list[torch.Tensor]]


class Deferred:
    """Each stage's W works held back until the W that computes their group."""

    def __init__(self, plan: Plan) -> None:
        self.batched = plan.weight_batch > 1
        self.groups = weight_groups(plan) if self.batched else {}  # per step: only if used
        self.held: dict[tuple[int, int], list[WeightWork]] = {}

    def take(self, a: Action, works: list[WeightWork]) -> list[list[WeightWork]]:
        """The works W action `a` computes now, one list per micro-batch: its own where
        nothing is batched; else its group's at the group's last W, none before."""
        if not self.batched:
            return [works]
        self.held[(a.stage, a.mb)] = works
        return [self.held.pop((a.stage, mb)) for mb in self.groups.get(a, ())]


def run_group(
    groups: Sequence[Sequence[WeightWork]], device: torch.device, *, nest: bool | None = None
) -> None:
    """W of the micro-batches in `groups` (each one list of works per segment), the matrix
    products of several batched; on a GPU from the autograd engine's thread, as
    backward_weights runs one micro-batch's (`nest` forces the choice, as there)."""
    if len(groups) == 1:
        backward_weights(groups[0], device, nest=nest)
        return
    if not groups:
        return

    def weights() -> None:
        for segment in zip(*groups, strict=True):
            batched_weight(segment)

    if nest is None:
        nest = device.type == "cuda" and any(w.pending for g in groups for w in g)
    if nest:
        on_engine_thread(weights, device)
    else:
        weights()


def batched_weight(works: Sequence[WeightWork]) -> None:
    """W of one segment for several micro-batches (`works`, one each): each matrix product
    their graphs share once over all of them, the rest micro-batch by micro-batch."""
    alike = len({len(w.captured) for w in works}) == 1
    left: list[list[Entry]] = [[] for _ in works]
    inputs: dict[tuple[tuple[int, int, tuple[int, ...]], ...], torch.Tensor] = {}
    for position in range(len(works[0].captured) if alike else 0):
        entries = [w.captured[position] for w in works]
        if not _batched_matmul(entries, inputs):
            for mine, entry in zip(left, entries, strict=True):
                mine.append(entry)
    for work, mine in zip(works, left, strict=True):
        rest = WeightWork(
            captured=mine if alike else list(work.captured),
            uncovered=list(work.uncovered),
            output=work.output,
            grad_output=work.grad_output,
            compiled=list(work.compiled),  # compiled blocks' W goes micro-batch by micro-batch
        )
        backward_weight(rest)
        work.compiled.clear()
        work.captured.clear()
        work.uncovered.clear()
        work.output = work.grad_output = None


def _batched_matmul(
    entries: Sequence[Entry],
    inputs: dict[tuple[tuple[int, int, tuple[int, ...]], ...], torch.Tensor],
) -> bool:
    """Add the weight gradients of one matrix product over several micro-batches (`entries`,
    the same node of each one's graph) into .grad in one product; False, nothing touched,
    where they are not the same product of the same weights with gradients to add to."""
    params = entries[0][2]
    roles = matmul_roles(entries[0][0], params)
    grads = [e[1][0] if len(e[1]) == 1 else None for e in entries]
    if roles is None or any(hooked(p) for p in params):
        return False
    for node, _, ps in entries[1:]:
        if len(ps) != len(params) or any(a is not b for a, b in zip(ps, params, strict=True)):
            return False
        if matmul_roles(node, ps) != roles:
            return False
    if any(g is None or g.dim() != 2 for g in grads):
        return False
    dtype = grads[0].dtype  # type: ignore[union-attr]
    for p in params:
        if p.dtype != dtype or (p.grad is not None and not p.grad.is_contiguous()):
            return False
    # a saved tensor is read once (recomputation's checkpoints allow no second unpack):
    # only now, with the product known to batch
    name = "_saved_mat1" if type(entries[0][0]).__name__ == "AddmmBackward0" else "_saved_self"
    mat1s = [getattr(e[0], name, None) for e in entries]
    if any(m is None or m.dim() != 2 for m in mat1s):
        raise RuntimeError("a matrix product saved no input for its weight's gradient")
    key = tuple((m.untyped_storage().data_ptr(), m.storage_offset(), tuple(m.shape)) for m in mat1s)  # type: ignore[union-attr]
    x = inputs.get(key)
    if x is None:  # only the latest is kept: the products sharing it come one after another
        inputs.clear()
        x = inputs[key] = torch.cat(mat1s)  # type: ignore[arg-type]
    dy = torch.cat(grads)  # type: ignore[arg-type]
    with torch.no_grad():
        for p, role in zip(params, roles, strict=True):
            if role == "bias":
                part = dy.sum(0)
                p.grad = part if p.grad is None else p.grad.add_(part)
                continue
            # y = x @ W.t() (a Linear): dW = dy.t() @ x; y = x @ W: dW = x.t() @ dy
            a, b = (dy.t(), x) if role == "transposed" else (x.t(), dy)
            p.grad = a.mm(b) if p.grad is None else p.grad.addmm_(a, b)
    return True
