"""Which dimension of each value in a captured block tensor parallelism splits, and the
block's shape literals along it made one rank's.

Between a column-wise projection and the row-wise one after it, each of t ranks holds 1/t
of the features, of the heads once the features are viewed as (heads, head size). A module
written for tensor parallelism views them with -1 (torchtitan's attention, Hugging Face's
and the zoo's gpt do), but a captured graph also keeps literals: Hugging Face's repeat_kv,
for grouped-query attention, expands and reshapes by the key/value head count, of which a
rank holds 1/t. `follow` traces the split dimension from the column-wise projections'
outputs through the graph, node by node, as DTensor propagates a Shard placement, and
`make_local` rewrites each literal along it to one rank's count. An operation it cannot
follow (a reduction over the heads, a view that moves them, a split value leaving the
block) is a one-line reason, never a silently wrong rank.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import fx

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_SAME_SHAPE = {
    aten.clone.default,
    aten.contiguous.default,
    aten.alias.default,
    aten.detach.default,
    aten.dropout.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten._to_copy.default,
    aten.type_as.default,
}
_REDUCTIONS = {aten.mean.dim, aten.sum.dim_IntList, aten.amax.default}
_SOFTMAX = {aten.softmax.int, aten._softmax.default, aten._log_softmax.default}
_MOVES = {aten.expand.default, aten.transpose.int, aten.permute.default, aten.unsqueeze.default}
_ALONG = {aten.cat.default, aten.slice.Tensor, aten.select.int, *_REDUCTIONS, *_SOFTMAX}
_SDPA = aten.scaled_dot_product_attention.default
_SYMBOLIC = 1_000_003
"""The size a symbolic (batch) dimension stands at in shape products: one no literal equals."""


class Unfollowable(ValueError):
    """The split dimension cannot be traced through an operation (the message says which)."""


@dataclass
class Trace:
    """The split dimension of every value between the column- and row-wise projections."""

    dims: dict[fx.Node, int] = field(default_factory=dict)
    origin: dict[fx.Node, str] = field(default_factory=dict)
    """The column-wise projection each split value comes from."""
    literals: list[tuple[fx.Node, int]] = field(default_factory=list)
    """(view or expand, position in its size list): a whole count a rank must divide."""
    heads: dict[str, int] = field(default_factory=dict)
    """Column-wise projection -> the heads its output is viewed as (attention's only)."""

    def size(self, node: fx.Node) -> int:
        """`node`'s whole size along its split dimension."""
        return shape(node)[self.dims[node]]

    def why_not(self, degree: int) -> str | None:
        """Why `degree` ranks cannot each hold an equal share of every split value."""
        for node, dim in self.dims.items():
            if self.size(node) % degree:
                return (
                    f"has {node.name} (from {self.origin[node]}) of {self.size(node)} along "
                    f"dimension {dim}, which {degree} ranks cannot share"
                )
        return None


def _size(d: object) -> int:
    if isinstance(d, int):
        return d
    expr = d.node.expr  # type: ignore[attr-defined]
    return int(expr.subs({s: _SYMBOLIC for s in expr.free_symbols}))


def shape(node: fx.Node) -> tuple[int, ...]:
    """`node`'s shape at capture (a symbolic size as _SYMBOLIC)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unfollowable(f"{node.name} has no recorded tensor shape")
    return tuple(_size(d) for d in val.shape)


def _aligned(split: Trace, node: fx.Node) -> int:
    """The output dimension of a broadcasting `node` its split inputs map to; its whole
    inputs must broadcast along it (size 1 there, or no such dimension)."""
    ndim = len(shape(node))
    tensors = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    dims = {split.dims[a] + ndim - len(shape(a)) for a in tensors if a in split.dims}
    if len(dims) != 1:
        raise Unfollowable(f"{node.name} ({node.target}) mixes values split along different dims")
    (dim,) = dims
    for a in tensors:
        at = dim - (ndim - len(shape(a)))
        if a not in split.dims and at >= 0 and shape(a)[at] != 1:
            raise Unfollowable(
                f"{node.name} ({node.target}) combines a split value with a whole one "
                f"({a.name}, {shape(a)[at]} along the split dimension)"
            )
    return dim


def _view(split: Trace, node: fx.Node, source: fx.Node) -> int:
    """The dimension of a view's output holding the split input dimension outermost."""
    ins, outs, i = shape(source), shape(node), split.dims[source]
    before = math.prod(ins[:i])
    for j in range(len(outs)):
        if math.prod(outs[:j]) != before or (outs[j] == 1 and ins[i] != 1):
            continue
        if outs[j] % ins[i] and ins[i] % outs[j]:
            break
        if outs[j] < ins[i] and split.origin[source] not in split.heads:
            split.heads[split.origin[source]] = outs[j]
        _literal(split, node, j)
        return j
    raise Unfollowable(
        f"{node.name} views {shape(source)} as {outs}, which moves the split dimension {i}"
    )


def _literal(split: Trace, node: fx.Node, dim: int) -> None:
    sizes = node.args[1]
    assert isinstance(sizes, Sequence)
    value = sizes[dim]
    if isinstance(value, fx.Node):
        raise Unfollowable(f"{node.name} sizes its split dimension {dim} by a symbolic value")
    if value != -1:
        split.literals.append((node, dim))


def _int(node: fx.Node, k: int, default: int = 0) -> int:
    value = node.args[k] if len(node.args) > k else default
    assert isinstance(value, int)
    return value


def _ints(value: object) -> list[int]:
    items = value if isinstance(value, list | tuple) else [value]
    ints = [d for d in items if isinstance(d, int)]
    assert len(ints) == len(items)
    return ints


def _input(node: fx.Node) -> fx.Node:
    source = node.args[0]
    assert isinstance(source, fx.Node)
    return source


def _moved(split: Trace, node: fx.Node) -> int | None:
    """Where a view, expand, transpose, permute or unsqueeze puts the split dimension."""
    target, source = node.target, _input(node)
    i, ndim = split.dims.get(source, -1), len(shape(node))
    if target in _VIEWS:
        return _view(split, node, source)
    if target is aten.expand.default:
        _literal(split, node, i + ndim - len(shape(source)))
        return i + ndim - len(shape(source))
    if target is aten.transpose.int:
        a, b = _int(node, 1) % ndim, _int(node, 2) % ndim
        return b if i == a else a if i == b else i
    if target is aten.permute.default:
        return [d % ndim for d in _ints(node.args[1])].index(i)
    if target is aten.unsqueeze.default:
        return i if i < _int(node, 1) % ndim else i + 1
    return None


def _beside(split: Trace, node: fx.Node) -> int | None:
    """Where an operation along another dimension (a slice, a reduction, a concatenation)
    keeps the split one; None where it works along the split one."""
    target = node.target
    if target is aten.cat.default:
        parts = node.args[0]
        assert isinstance(parts, list | tuple)
        dims = {split.dims.get(p, -1) if isinstance(p, fx.Node) else -1 for p in parts}
        at = _int(node, 1) % len(shape(node))
        return dims.pop() if len(dims) == 1 and -1 not in dims and at not in dims else None
    source = _input(node)
    i, ndim = split.dims.get(source, -1), len(shape(source))
    if target in (aten.slice.Tensor, aten.select.int):
        at = _int(node, 1) % ndim
        return None if at == i else i - int(target is aten.select.int and at < i)
    if target in _REDUCTIONS or target in _SOFTMAX:
        over = [d % ndim for d in _ints(node.args[1] if len(node.args) > 1 else [])]
        keep = target in _SOFTMAX or (len(node.args) > 2 and bool(node.args[2]))
        if not over or i in over:
            return None
        return i if keep else i - sum(d < i for d in over)
    return None


def _rule(split: Trace, node: fx.Node) -> int:
    """The split dimension of `node`'s output, from its split inputs'."""
    target = node.target
    dim: int | None = None
    if target in _VIEWS or target in _MOVES:
        dim = _moved(split, node)
    elif target in _ALONG:
        dim = _beside(split, node)
    elif target is _SDPA:
        heads = len(shape(node)) - 3
        qkv = node.args[:3]
        if not all(isinstance(x, fx.Node) and split.dims.get(x) == heads for x in qkv):
            raise Unfollowable(f"{node.name} takes a query, key and value not all split by heads")
        dim = _aligned(split, node)
    elif target is operator.getitem:
        dim = split.dims[_input(node)]
    elif target in _SAME_SHAPE or _pointwise(target):
        dim = _aligned(split, node)
    if dim is None:
        raise Unfollowable(f"{node.name} ({target}) works along the split heads or features")
    return dim


def _pointwise(target: object) -> bool:
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


def follow(graph: fx.Graph, colwise: set[str], rowwise: set[str]) -> Trace:
    """The split dimension of each value from the `colwise` modules' outputs to the inputs
    of the `rowwise` ones (module paths in `graph`'s owner); Unfollowable where it cannot
    be traced, or a split value leaves the block or enters a projection other than a
    row-wise one along its features."""
    split = Trace()
    for node in graph.nodes:
        inputs = [a for a in node.all_input_nodes if a in split.dims]
        if node.op == "call_module" and node.target in colwise:
            if inputs:
                raise Unfollowable(f"{node.target} takes a value already split")
            split.dims[node] = len(shape(node)) - 1
            split.origin[node] = str(node.target)
            continue
        if not inputs:
            continue
        if node.op == "output":
            raise Unfollowable(
                f"{inputs[0].name} (from {split.origin[inputs[0]]}) leaves the block split: "
                "the block ends between a column-wise projection and its row-wise one"
            )
        if node.op == "call_module":
            x = _input(node)
            if node.target not in rowwise or split.dims.get(x) != len(shape(x)) - 1:
                raise Unfollowable(f"{node.target} takes a split value it cannot sum")
            continue
        split.dims[node] = _rule(split, node)
        split.origin[node] = split.origin[inputs[0]]
    return split


def make_local(graph: fx.Graph, split: Trace, degree: int) -> None:
    """Each literal along the split dimension (Trace.literals) one of `degree` ranks' share."""
    for node, dim in split.literals:
        given = node.args[1]
        assert isinstance(given, list | tuple)
        sizes = list(given)
        sizes[dim] = _ints(sizes[dim])[0] // degree
        node.update_arg(1, sizes)
