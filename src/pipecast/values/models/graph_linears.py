"""A captured block's linear layers as nn.Linear modules again.

torch.export records an nn.Linear as an `aten.linear` call on its weight and bias, and the
block keeps only a plain module holding them. Tools that work on modules then find no
Linear there: torch's tensor-parallel styles (ColwiseParallel, RowwiseParallel) split an
nn.Linear's weight and hook its forward, and the profiler swaps a Linear for one rank's
share of it. So each such call becomes a call of an nn.Linear holding the same Parameter
objects, at the same path: parameter names and ties stay as they were, and the block
computes the same values through the same kernels.
"""

from __future__ import annotations

import torch
from torch import fx, nn

_LINEAR = torch.ops.aten.linear.default


def _holder(body: fx.GraphModule, node: fx.Node) -> str | None:
    """The path of the module whose own weight (and bias) `node`, an aten.linear, uses; None
    where they are not one plain module's weight and bias."""
    weight = node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    path, _, leaf = str(weight.target).rpartition(".")
    if leaf != "weight" or not path:
        return None
    if bias is not None and (not isinstance(bias, fx.Node) or bias.target != f"{path}.bias"):
        return None
    owner = body.get_submodule(path)
    if isinstance(owner, nn.Linear):
        return path if owner.bias is None or bias is not None else None
    own = dict(owner.named_parameters(recurse=False))
    wanted = {"weight"} | ({"bias"} if bias is not None else set())
    plain = type(owner) is nn.Module and not list(owner.children())
    if not plain or set(own) != wanted or list(owner.buffers()) or own["weight"].dim() != 2:
        return None
    return path


def _as_linear(owner: nn.Module) -> nn.Linear:
    weight = owner.weight
    bias = getattr(owner, "bias", None)
    assert isinstance(weight, nn.Parameter)
    outs, ins = weight.shape
    linear = nn.Linear(ins, outs, bias=bias is not None, device="meta")
    linear.weight = weight
    if bias is not None:
        linear.bias = bias
    return linear


def linears_as_modules(body: fx.GraphModule) -> list[str]:
    """Each aten.linear on one module's own weight (and bias) in `body` a call of an
    nn.Linear holding them; the paths of those Linears."""
    graph = body.graph
    paths: list[str] = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _LINEAR or node.kwargs:
            continue
        path = _holder(body, node)
        if path is None:
            continue
        parent, _, leaf = path.rpartition(".")
        owner = body.get_submodule(path)
        if not isinstance(owner, nn.Linear):
            setattr(body.get_submodule(parent) if parent else body, leaf, _as_linear(owner))
        with graph.inserting_before(node):
            call = graph.call_module(path, (node.args[0],))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        attrs = node.args[1:]
        graph.erase_node(node)
        for attr in attrs:
            if isinstance(attr, fx.Node) and not attr.users:
                graph.erase_node(attr)
        paths.append(path)
    if paths:
        graph.lint()
        body.recompile()
    return paths
