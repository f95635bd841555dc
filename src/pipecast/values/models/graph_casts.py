"""The dtypes and devices a capture baked into its graph, made to follow the run's.

A model is captured once, in fp32 on the host; its blocks then run on a GPU, often in bf16.
A cast names the dtype it had at capture, a device argument the capture's device, and
torch's export adds checks of both (`_assert_tensor_metadata`). The block builder
(graph_blocks) copies each block's nodes through these rules: casts that did nothing at
capture follow the dtype the block runs in (round_trips), and the graphs nested in
higher-order operations (a rotary embedding computed without gradients) drop their checks
and take their device from their inputs (portable_nested).
"""

from __future__ import annotations

import torch
from torch import fx

_CASTS = (torch.ops.aten.to.dtype_layout, torch.ops.aten._to_copy.default)
_POSITIONAL = {torch.ops.aten.to.dtype: 1, torch.ops.aten.to.device: 2}
"""Casts whose dtype is a positional argument: its index."""


def cast_dtype(node: fx.Node) -> object:
    """The dtype cast `node` converts to (None: no cast, or none given)."""
    if node.target in _CASTS:
        return node.kwargs.get("dtype")
    at = _POSITIONAL.get(node.target)  # type: ignore[call-overload]
    return node.args[at] if at is not None and len(node.args) > at else None


def follow(cast: fx.Node, origin: fx.Node) -> None:
    """Make `cast` convert to the dtype `origin` has when the graph runs."""
    dtype = cast.graph.call_function(getattr, (origin, "dtype"))
    cast.prepend(dtype)
    if cast.target in _CASTS:
        cast.update_kwarg("dtype", dtype)
    else:
        cast.update_arg(_POSITIONAL[cast.target], dtype)  # type: ignore[index]


def noop_cast(node: fx.Node) -> bool:
    dtype = cast_dtype(node)
    if dtype is None:
        return False
    source = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    return isinstance(source, torch.Tensor) and source.dtype == dtype


def round_trips(graph: fx.Graph) -> tuple[dict[fx.Node, fx.Node], dict[fx.Node, fx.Node]]:
    """Casts that did nothing at capture and come in pairs: the second of each pair -> the
    first. A model that computes a step in fp32 (a norm's variance, rotary angles) casts up
    and then back to the dtype its activations run in; captured in fp32, both casts name
    fp32 and do nothing. Run in bf16, the first must still cast up (kept as captured) and
    the second back to the block's dtype (its input's). A cast that did nothing and has no
    pair keeps its value's dtype, whatever the run's. The pair: a second no-op cast whose value was
    computed from the first's, through no other such cast, with nothing else from the
    model's input mixed in (positions, constants and weights may be: a residual stream
    that met a mask's cast in attention does not end the mask's trip). Also: each node
    computed on a trip -> the cast that began it."""
    began: dict[fx.Node, fx.Node] = {}  # node -> the unpaired no-op cast it derives from
    live: set[fx.Node] = set()  # computed from the model's input
    pairs: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        inputs = node.all_input_nodes
        origins = {began[i] for i in inputs if i in began}
        mixed = any(i in live and i not in began for i in inputs)
        if node.op == "placeholder" or any(i in live for i in inputs):
            live.add(node)
        if noop_cast(node):
            if len(origins) == 1 and not mixed:
                pairs[node] = origins.pop()
            else:
                began[node] = node
        elif len(origins) == 1 and not mixed and node.op == "call_function":
            began[node] = origins.pop()
    started = set(pairs.values())
    return pairs, {n: c for n, c in began.items() if c in started and n is not c}


def baked_device(node: fx.Node) -> bool:
    """Whether `node` names a device the capture baked in (as a keyword, or as
    aten.to.device's second argument)."""
    if isinstance(node.kwargs.get("device"), torch.device):
        return True
    moved = node.target is torch.ops.aten.to.device and len(node.args) > 1
    return moved and isinstance(node.args[1], torch.device)


def set_device(node: fx.Node, device: fx.Node) -> None:
    """Make `node`, which baked_device, use `device` (a node giving one when it runs)."""
    if isinstance(node.kwargs.get("device"), torch.device):
        node.update_kwarg("device", device)
    else:  # aten.to.device names its device in its arguments
        node.update_arg(1, device)


def portable_nested(root: fx.GraphModule) -> None:
    """The graphs nested in `root` (the bodies of higher-order operations), in place: the
    capture's dtype and device checks dropped, and devices the capture named taken from
    the nested graph's first input. Their casts stay as captured: such a body computes in
    fp32 as the model asked (a rotary embedding's angles), and what it returns is cast to
    the block's dtype where the block uses it (graph_blocks)."""
    for sub in root.modules():
        if sub is root or not isinstance(sub, fx.GraphModule):
            continue
        graph = sub.graph
        first = next((n for n in graph.nodes if n.op == "placeholder"), None)
        device: fx.Node | None = None
        for node in list(graph.nodes):
            if node.target is torch.ops.aten._assert_tensor_metadata.default:
                graph.erase_node(node)
                continue
            if first is None or not baked_device(node):
                continue
            if device is None:
                with graph.inserting_after(first):
                    device = graph.call_function(getattr, (first, "device"))
            set_device(node, device)
        graph.lint()
        sub.recompile()
