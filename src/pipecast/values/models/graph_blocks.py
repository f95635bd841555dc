"""Pipeline blocks cut from an exported graph, each one a module from one tensor to one.

pipecast's profiler, partitioner, simulator and runtime pass one tensor from block to block.
Where several cross a cut (a skip connection beside the main path) the block before packs
them into one (batch, features) tensor of their widest dtype and the block after unpacks
them: the same bytes cross, as one message, and the rest of pipecast works unchanged.

A parameter used by two blocks (an LM's embedding and its head) stays one Parameter in the
process that captured the model; `GraphBlock.tied` names it, so that a runtime holding the
blocks on different ranks can keep the copies equal (pipecast.runtime.ties).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

from pipecast.values.models.graph_casts import (
    baked_device,
    cast_dtype,
    follow,
    noop_cast,
    portable_nested,
    round_trips,
    set_device,
)
from pipecast.values.models.graph_cuts import GraphCuts, batch_symbol, is_batch
from pipecast.values.models.graph_linears import linears_as_modules

Slot = tuple[tuple[int, ...], str]
"""A tensor crossing a cut: its shape past the batch dimension, and its dtype's name."""


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """(B, ...) tensors as one (B, features) tensor of their widest dtype."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.cat([t.reshape(t.shape[0], -1).to(dtype) for t in tensors], dim=1)


def unpack(x: torch.Tensor, slots: Sequence[Slot]) -> list[torch.Tensor]:
    """The tensors `pack` joined, each in its shape (in the packed dtype)."""
    out, offset = [], 0
    for shape, _ in slots:
        n = math.prod(shape)
        out.append(x[:, offset : offset + n].reshape(x.shape[0], *shape))
        offset += n
    return out


class GraphBlock(nn.Module):
    """A run of an exported graph's nodes: one tensor in, one tensor out."""

    def __init__(
        self,
        body: fx.GraphModule,
        label: str,
        takes: list[Slot],
        gives: list[Slot],
        begins: str = "",
    ) -> None:
        super().__init__()
        self.body = body
        self.label = label
        """The module path the block's nodes share (e.g. 'transformer.h.3')."""
        self.takes, self.gives = takes, gives
        self.begins = begins
        """The module at whose start the block begins ('' for the first block)."""
        self.tied: dict[str, str] = {}
        """Parameter name in this block -> the name of the tie it belongs to."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = unpack(x, self.takes) if len(self.takes) > 1 else [x]
        out = self.body(*parts)
        if len(self.gives) > 1:
            return pack(out)
        result: torch.Tensor = out
        return result

    def extra_repr(self) -> str:
        return f"{self.label}: {len(self.takes)} tensor(s) in, {len(self.gives)} out"


def _slots(nodes: Sequence[fx.Node]) -> list[Slot]:
    out = []
    for n in nodes:
        val = n.meta["val"]
        out.append((tuple(int(d) for d in val.shape[1:]), str(val.dtype).removeprefix("torch.")))
    return out


def _block_graph(
    cuts: GraphCuts, start: int, stop: int, inputs: list[fx.Node], outputs: list[fx.Node]
) -> fx.Graph:
    """A graph of heavy[start:stop] from placeholders `inputs` to `outputs`, recomputing the
    free values it uses."""
    source = cuts.heavy[0].graph
    batch = batch_symbol(source)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for k, node in enumerate(inputs):
        env[node] = graph.placeholder(f"in{k}")
        env[node].meta = dict(node.meta)
    first = env[inputs[0]]
    device: fx.Node | None = None
    back, began = round_trips(source)
    starts = set(back.values())
    upcast: dict[fx.Node, fx.Node] = {}
    val = inputs[0].meta.get("val")
    floating = isinstance(val, torch.Tensor) and val.dtype.is_floating_point

    def copy(node: fx.Node) -> fx.Node:
        """`node` in `graph`; a device the capture baked in (arange's) becomes the block
        input's, a cast that did nothing at capture follows the dtype the block runs in
        (graph_casts.round_trips), and what a nested graph returns is cast to it, so blocks
        captured in fp32 on the host run where they are moved, in the dtype they are
        given."""
        nonlocal device

        def value(n: fx.Node) -> fx.Node:
            """A round trip's first cast does nothing in the copy (the capture may have used
            it for its input elsewhere, a residual, or passed it on across a cut); the
            trip's own nodes get a cast up of their own, once per block."""
            if n not in starts or (began.get(node) is not n and back.get(node) is not n):
                return env[n]
            if n not in upcast:
                dtype: Any = cast_dtype(n)
                upcast[n] = graph.call_function(torch.ops.aten.to.dtype, (env[n], dtype))
            return upcast[n]

        made = graph.node_copy(node, value)
        if noop_cast(node):
            if node in back and floating:  # a round trip's end: the block's own dtype
                follow(made, first)
            else:  # a trip's start, or no trip: the value's own dtype
                follow(made, made.args[0])  # type: ignore[arg-type]
        if baked_device(made):
            if device is None:
                device = graph.call_function(getattr, (first, "device"))
                made.prepend(device)
            set_device(made, device)
        if floating and _from_nested(node):
            dtype = graph.call_function(getattr, (first, "dtype"))
            return graph.call_function(torch.ops.aten.to.dtype, (made, dtype))
        return made

    def need(node: fx.Node) -> fx.Node:
        if node in env:
            return env[node]
        if node not in cuts.free and node.op != "get_attr":
            raise ValueError(f"node {node.name} is used across a cut but does not cross it")
        if node.target is torch.ops.aten.sym_size.int and is_batch(node.meta.get("val"), batch):
            env[node] = graph.call_function(torch.ops.aten.sym_size.int, (first, 0))
        else:
            for i in node.all_input_nodes:
                need(i)
            env[node] = copy(node)
        return env[node]

    for node in cuts.heavy[start:stop]:
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            continue  # the capture's dtype and device, which a moved block no longer has
        for used in node.all_input_nodes:
            need(used)
        env[node] = copy(node)
    results = [env[o] for o in outputs]
    graph.output(results[0] if len(results) == 1 else tuple(results))
    graph.lint()
    return graph


def _from_nested(node: fx.Node) -> bool:
    """Whether `node` is a floating value a higher-order operation's nested graph returned."""
    source = node.args[0] if node.target is operator.getitem and node.args else None
    val = node.meta.get("val")
    return (
        isinstance(source, fx.Node)
        and isinstance(source.target, torch._ops.HigherOrderOperator)
        and isinstance(val, torch.Tensor)
        and val.dtype.is_floating_point
    )


def build_blocks(root: fx.GraphModule, cuts: GraphCuts) -> list[GraphBlock]:
    """One GraphBlock per run of heavy nodes between `cuts.cuts`, sharing `root`'s
    parameters, its linear layers nn.Linear modules again (graph_linears); parameters used
    by several blocks are named in each block's `tied`."""
    portable_nested(root)
    graph = root.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    final = output.all_input_nodes
    if len(inputs) != 1 or len(final) != 1:
        raise ValueError(
            f"the model must take one tensor and return one (it takes {len(inputs)} "
            f"and returns {len(final)})"
        )
    n = len(cuts.heavy)
    bounds = [0, *cuts.cuts, n]
    blocks: list[GraphBlock] = []
    for b, (start, stop) in enumerate(itertools.pairwise(bounds)):
        takes = inputs if start == 0 else cuts.crossing[start]
        gives = final if stop == n else cuts.crossing[stop]
        body = fx.GraphModule(root, _block_graph(cuts, start, stop, takes, gives))
        linears_as_modules(body)
        slots = _slots(takes), _slots(gives)
        blocks.append(GraphBlock(body, cuts.labels[b], *slots, cuts.begins[b]))
    _mark_ties(blocks)
    return blocks


def _mark_ties(blocks: list[GraphBlock]) -> None:
    users: dict[int, list[tuple[GraphBlock, str]]] = {}
    for block in blocks:
        for name, p in block.named_parameters():
            users.setdefault(id(p), []).append((block, name))
    for holders in users.values():
        if len(holders) > 1:
            key = holders[0][1].removeprefix("body.")
            for block, name in holders:
                block.tied[name] = key
