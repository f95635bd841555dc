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
from collections.abc import Sequence

import torch
from torch import fx, nn

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

    def copy(node: fx.Node) -> fx.Node:
        """`node` in `graph`; a device the capture baked in (arange's) becomes the block
        input's, and a cast that did nothing at capture keeps the value's dtype, so blocks
        captured in fp32 on the host run where they are moved, in the dtype they are given."""
        nonlocal device
        made = graph.node_copy(node, lambda n: env[n])
        if _noop_cast(node):
            made.update_kwarg("dtype", None)
        if isinstance(made.kwargs.get("device"), torch.device):
            if device is None:
                device = graph.call_function(getattr, (first, "device"))
                made.prepend(device)
            made.update_kwarg("device", device)
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


_CASTS = (torch.ops.aten.to.dtype_layout, torch.ops.aten._to_copy.default)


def _noop_cast(node: fx.Node) -> bool:
    if node.target not in _CASTS or "dtype" not in node.kwargs:
        return False
    source = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    return isinstance(source, torch.Tensor) and source.dtype == node.kwargs["dtype"]


def build_blocks(root: fx.GraphModule, cuts: GraphCuts) -> list[GraphBlock]:
    """One GraphBlock per run of heavy nodes between `cuts.cuts`, sharing `root`'s
    parameters, its linear layers nn.Linear modules again (graph_linears); parameters used
    by several blocks are named in each block's `tied`."""
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
