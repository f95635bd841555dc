"""Backward of one stage for one micro-batch, whole (BW) or split into B and W.

B computes only the gradient with respect to the stage input, which the previous stage waits
for; W computes the parameter gradients later, filling pipeline bubbles (zero-bubble
schedules). The split works on the autograd graph, for any module:

* During B, autograd runs only the nodes on paths to the input. Where such a node also feeds a
  side branch that leads to parameters (a Linear's AddmmBackward feeds TBackward -> weight), a
  pre-hook captures the gradient flowing into the node.
* During W, each captured node is re-entered through its GradientEdge with the captured
  gradient, asking only for its own side-branch parameters, so nothing of B is recomputed.

Parameters no captured node reaches are differentiated from the output in W (correct, slower).
A stage whose input needs no gradient (the first) does its whole backward in B; W is empty.

A compiled block (pipecast.runtime.compiled) is one node whose backward pipecast compiled
split: B runs it inside `compiled.splitting()`, where it computes its input's gradient
alone and leaves its weight-gradient code for W (`WeightWork.compiled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node

from pipecast.runtime import compiled, weight_grads
from pipecast.runtime.autograd_calls import accumulate_into, engine_call, on_engine_thread
from pipecast.runtime.compiled import PendingWeights

_ACCUMULATE = "AccumulateGrad"


@dataclass
class WeightWork:
    """What W needs for one micro-batch: captured gradients and the params they lead to."""

    captured: list[tuple[Node, tuple[torch.Tensor | None, ...], list[torch.Tensor]]] = field(
        default_factory=list
    )

    @property
    def held_bytes(self) -> int:
        """Bytes of the output gradients B captured and W still needs (for a compiled block,
        what its weight-gradient code reads that B computed)."""
        seen: dict[int, int] = {}
        held = [g for _, grads, _ in self.captured for g in grads]
        held += [t for pending in self.compiled for t in pending.args]
        for g in held:
            if isinstance(g, torch.Tensor):
                storage = g.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    uncovered: list[torch.Tensor] = field(default_factory=list)
    output: torch.Tensor | None = None
    grad_output: torch.Tensor | None = None
    compiled: list[PendingWeights] = field(default_factory=list)
    """Compiled blocks' weight-gradient code, as B left it."""

    @property
    def pending(self) -> bool:
        """Whether W has anything left to compute."""
        return (
            bool(self.captured)
            or bool(self.compiled)
            or bool(self.uncovered and self.output is not None)
        )


def _children(root: Node) -> dict[Node, list[Node]]:
    """Every node reachable from `root`, each with its children, in post order (children
    before parents; dicts keep insertion order). Each node's next_functions is read once:
    building that tuple is most of a walk's cost."""
    out: dict[Node, list[Node]] = {}
    seen: set[Node] = set()
    stack: list[tuple[Node, list[Node] | None]] = [(root, None)]
    while stack:
        node, kids = stack.pop()
        if kids is not None:
            out[node] = kids
            continue
        if node in seen:
            continue
        seen.add(node)
        kids = [c for c, _ in node.next_functions if c is not None]
        stack.append((node, kids))
        stack.extend((c, None) for c in kids if c not in seen)
    return out


def _weight_nodes(
    output: torch.Tensor, stage_input: torch.Tensor, params: Sequence[torch.Tensor]
) -> tuple[dict[Node, list[torch.Tensor]], list[torch.Tensor]]:
    """Input-path nodes with parameter side branches, and the params none of them reach.
    A parameter used again further down the input path (a module called twice) is left to
    the second list: re-entering the upper node would run on down the path to the lower
    use and count that use twice, so W differentiates it once from the output instead."""
    assert output.grad_fn is not None
    by_id = {id(p): p for p in params}
    leads_to_input: dict[Node, bool] = {}
    params_below: dict[Node, dict[int, torch.Tensor]] = {}
    own: dict[Node, list[torch.Tensor]] = {}
    reused: set[int] = set()
    split_compiled: set[int] = set()
    for node, children in _children(output.grad_fn).items():
        if not children and type(node).__name__ == _ACCUMULATE:
            variable = node.variable  # type: ignore[attr-defined]
            leads_to_input[node] = variable is stage_input
            params_below[node] = {id(variable): variable} if id(variable) in by_id else {}
            continue
        below: dict[int, torch.Tensor] = {}
        side: dict[int, torch.Tensor] = {}
        trunk: set[int] = set()
        on_path = False
        for child in children:
            found = params_below[child]
            if not found:
                on_path = on_path or leads_to_input[child]
                continue
            below.update(found)
            if leads_to_input[child]:
                on_path = True
                trunk.update(found)
            else:
                side.update(found)
        leads_to_input[node] = on_path
        params_below[node] = below
        if on_path and compiled.is_compiled_node(node):  # its own B leaves its W (module notes)
            marked = {id(p) for p in (compiled.marked_params(node) or {}).values()}
            split_compiled.update(i for i in side if i in marked)
            side = {i: p for i, p in side.items() if i not in marked}
        if on_path and side:
            own[node] = list(side.values())
            reused.update(trunk.intersection(side))
    if reused:
        own = {n: kept for n, ps in own.items() if (kept := [p for p in ps if id(p) not in reused])}
    covered = {id(p) for ps in own.values() for p in ps} | split_compiled
    return own, [p for p in params if id(p) not in covered]


def _seed(output: torch.Tensor, grad_output: torch.Tensor | None) -> torch.Tensor:
    return torch.ones_like(output) if grad_output is None else grad_output


def backward_full(
    output: torch.Tensor,
    grad_output: torch.Tensor | None,
    stage_input: torch.Tensor | None,
    params: Sequence[torch.Tensor],
) -> torch.Tensor | None:
    """BW: parameter gradients accumulated into .grad; returns the input gradient (or None)."""
    trainable = [p for p in params if p.requires_grad]
    wants_input = stage_input is not None and stage_input.requires_grad
    inputs = [stage_input, *trainable] if stage_input is not None and wants_input else trainable
    if not inputs or not output.requires_grad:
        return None
    # autograd accumulates into .grad itself (in C++), as .backward() does
    engine_call((output,), (_seed(output, grad_output),), inputs, accumulate=True, keep=False)
    if stage_input is not None and wants_input:
        grad_input, stage_input.grad = stage_input.grad, None
        return grad_input
    return None


def backward_input(
    output: torch.Tensor,
    grad_output: torch.Tensor | None,
    stage_input: torch.Tensor | None,
    params: Sequence[torch.Tensor],
) -> tuple[torch.Tensor | None, WeightWork]:
    """B: the input gradient now; what W needs later. Without an input that needs a
    gradient, B is the whole backward and W has nothing to do."""
    params = [p for p in params if p.requires_grad]
    if stage_input is None or not stage_input.requires_grad:
        backward_full(output, grad_output, None, params)
        return None, WeightWork()
    own, uncovered = _weight_nodes(output, stage_input, params)
    captured: dict[Node, tuple[torch.Tensor | None, ...]] = {}

    def capture(node: Node) -> object:
        def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            captured[node] = grad_outputs

        return hook

    handles = [node.register_prehook(capture(node)) for node in own]  # type: ignore[arg-type]
    seed = _seed(output, grad_output)
    # W re-enters the graph only for captured nodes or uncovered weights; a stage of
    # compiled blocks alone frees what its forward saved as B goes, as a whole backward does
    keep = bool(own) or bool(uncovered)
    try:
        with compiled.splitting() as pending:
            (grad_input,) = engine_call(
                (output,), (seed,), (stage_input,), accumulate=False, keep=keep
            )
    finally:
        for handle in handles:
            handle.remove()
    if grad_input is None:
        raise RuntimeError("the stage's output does not depend on its input")
    work = WeightWork(uncovered=uncovered, compiled=pending)
    for node, node_params in own.items():
        if node in captured:
            work.captured.append((node, captured[node], node_params))
        else:  # the node was not needed for the input gradient after all
            work.uncovered.extend(node_params)
    if work.uncovered:
        work.output, work.grad_output = output, seed
    return grad_input, work


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a stage's forward was cut into separate graphs (pipecast.values.profile.segments): the
    output of one segment and the leaf the next segment started from."""

    output: torch.Tensor
    leaf: torch.Tensor


def backward_input_segments(
    output: torch.Tensor,
    grad_output: torch.Tensor | None,
    stage_input: torch.Tensor | None,
    cuts: Sequence[Cut],
    params: Sequence[Sequence[torch.Tensor]],
) -> tuple[torch.Tensor | None, list[WeightWork]]:
    """B over a stage cut into segments, `params[i]` the weights of segment i: each
    segment's B from its own output, the last first, handing the gradient of its leaf to
    the segment below. W then re-enters only its own segment's graph."""
    outputs = [c.output for c in cuts] + [output]
    inputs = [stage_input] + [c.leaf for c in cuts]
    if len(params) != len(outputs):
        raise ValueError(f"{len(outputs)} segments but {len(params)} lists of weights")
    works = []
    grad = grad_output
    for out, inp, ps in zip(reversed(outputs), reversed(inputs), reversed(params), strict=True):
        grad, work = backward_input(out, grad, inp, ps)
        works.append(work)
    return grad, works


_DIRECT_WEIGHTS = True


def backward_weight(work: WeightWork, *, direct: bool | None = None) -> None:
    """W: parameter gradients from what B captured, accumulated into .grad: for the node
    kinds weight_grads knows, by the op the engine would run (`direct`, default on), else
    by an autograd call per node."""
    if direct is None:
        direct = _DIRECT_WEIGHTS
    for pending in work.compiled:
        pending.run()
    work.compiled.clear()
    for node, grad_outputs, params in work.captured:
        if direct and weight_grads.accumulate(node, grad_outputs, params):
            continue
        slots = [i for i, g in enumerate(grad_outputs) if g is not None]
        if not slots:
            continue
        edges = [GradientEdge(node, i) for i in slots]
        seeds = [g for g in grad_outputs if g is not None]
        engine_call(edges, seeds, params, accumulate=True)  # into .grad, in C++
    if work.uncovered and work.output is not None and work.grad_output is not None:
        grads = engine_call((work.output,), (work.grad_output,), work.uncovered, accumulate=False)
        accumulate_into(work.uncovered, grads)
    work.captured.clear()
    work.uncovered.clear()
    work.output = work.grad_output = None


_NEST_WEIGHTS = True


def backward_weights(
    works: Sequence[WeightWork], device: torch.device, *, nest: bool | None = None
) -> None:
    """W of one action: `backward_weight` of each of its works (one per segment). On a GPU
    all of them run from the autograd engine's worker thread (`on_engine_thread`): W makes
    one autograd call per node that feeds weights, seven per transformer layer, and a call
    made there skips the hand-over to that thread that each call from outside pays
    (docs/decisions.md, "W by the op"). `nest` forces the choice (default: on a GPU, where
    there is any work: the hand-over of the whole batch costs what an empty W saves)."""
    if nest is None:
        nest = device.type == "cuda" and _NEST_WEIGHTS and any(w.pending for w in works)

    def weights() -> None:
        for work in works:
            backward_weight(work)

    if nest:
        on_engine_thread(weights, device)
    else:
        weights()
