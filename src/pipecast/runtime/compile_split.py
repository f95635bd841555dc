"""A compiled backward split in two: the input's gradient (B) and the weights' (W).

AOTAutograd traces a block's backward as one FX graph whose outputs are the gradients of
the forward's inputs, in their order: the block's input and its weights. A zero-bubble
schedule runs those two kinds of output at different times, so the graph is cut in two:

* **dI** computes every node the input's gradient depends on, and hands on the values W
  will need that it computed anyway (the gradient flowing into each weight's matrix
  product, typically): the "handoffs";
* **dW** starts from those handoffs and from the backward's own inputs (the saved
  activations) and computes the weights' gradients.

No node runs in both: a node dI computes and dW needs reaches dW as a handoff, never again.
Graph inputs dW needs are passed to it straight, not through dI. The rule is the one
AOTAutograd's default partitioner applies between a forward and a backward, and the one
torchtitan's graph pipeline applies to split a backward (facts carried from their sources;
this module is written for pipecast).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch.fx as fx


@dataclass(frozen=True)
class SplitBackward:
    """The two graphs and how to call them. With the backward's inputs `args`:
    ``di(args)`` returns the input gradients (in `input_grads`' order) then the handoffs;
    ``dw([args[i] for i in dw_args] + handoffs)`` returns the weight gradients (in
    `weight_grads`' order)."""

    di: fx.GraphModule
    dw: fx.GraphModule
    input_grads: tuple[int, ...]
    """Positions, in the backward's outputs, of the gradients dI computes."""
    weight_grads: tuple[int, ...]
    """Positions, in the backward's outputs, of the gradients dW computes."""
    dw_args: tuple[int, ...]
    """Positions, in the backward's inputs, of those dW reads straight."""
    handoffs: int
    """How many values dI hands dW after the input gradients."""
    outputs: int
    """How many outputs the whole backward has (the rest are None)."""


def _ancestors(roots: Iterable[fx.Node], given: Iterable[fx.Node] = ()) -> set[fx.Node]:
    """`roots` and every node they are computed from, up to the `given` ones (included,
    not looked past)."""
    stop = set(given)
    seen: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in stop:
            stack.extend(node.all_input_nodes)
    return seen


def _subgraph(
    owner: fx.GraphModule,
    order: Sequence[fx.Node],
    inputs: Sequence[fx.Node],
    outputs: Sequence[fx.Node],
) -> fx.GraphModule:
    """A graph of `owner`'s nodes from `inputs` (placeholders, in this order) to `outputs`,
    with every node between them copied in `order` (metadata kept: the compiler reads each
    node's example value)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        placeholder = graph.placeholder(node.name)
        placeholder.meta = dict(node.meta)
        env[node] = placeholder
    needed = _ancestors(outputs, inputs)
    for node in order:
        if node in env or node not in needed or node.op in ("placeholder", "output"):
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in outputs))
    return fx.GraphModule(owner, graph)


def split_backward(gm: fx.GraphModule, input_positions: Iterable[int]) -> SplitBackward:
    """Cut backward graph `gm` into dI, for the outputs at `input_positions` (the block's
    inputs that are not weights), and dW, for the other outputs that are not None. An input
    gradient missing (None) or no weight gradient at all leaves that graph empty: it returns
    nothing, and the caller need not run it."""
    order = list(gm.graph.nodes)
    placeholders = [n for n in order if n.op == "placeholder"]
    (output,) = [n for n in order if n.op == "output"]
    results = list(output.args[0])
    wanted = set(input_positions)
    input_grads = tuple(i for i, r in enumerate(results) if i in wanted and isinstance(r, fx.Node))
    weight_grads = tuple(
        i for i, r in enumerate(results) if i not in wanted and isinstance(r, fx.Node)
    )
    di_roots = [results[i] for i in input_grads]
    dw_roots = [results[i] for i in weight_grads]
    in_di = _ancestors(di_roots)
    in_dw = _ancestors(dw_roots)
    only_dw = in_dw - in_di
    roots = set(dw_roots)
    # what dW reads that dI computed (or that is an input of the whole backward)
    borders = [
        n
        for n in order
        if n in in_dw and n in in_di and (n in roots or any(user in only_dw for user in n.users))
    ]
    straight = [n for n in borders if n.op == "placeholder"]
    handoffs = [n for n in borders if n.op != "placeholder"]
    di = _subgraph(gm, order, placeholders, [*di_roots, *handoffs])
    dw_inputs = [n for n in placeholders if n in only_dw or n in straight]
    dw = _subgraph(gm, order, [*dw_inputs, *handoffs], dw_roots)
    return SplitBackward(
        di=di,
        dw=dw,
        input_grads=input_grads,
        weight_grads=weight_grads,
        dw_args=tuple(placeholders.index(n) for n in dw_inputs),
        handoffs=len(handoffs),
        outputs=len(results),
    )
