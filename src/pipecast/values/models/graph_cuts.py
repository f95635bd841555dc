"""Where an exported graph can be cut into pipeline blocks, and what crosses each cut.

The nodes of a `torch.export` graph fall in three kinds:

* free: pure values that depend on nothing but buffers, constants and the batch size (an
  attention mask, position ids, a shape). A block that needs one recomputes it, so a free
  value never crosses a cut: a mask built once in front of a decoder would otherwise travel
  through every stage.
* heavy: everything else the model computes, in the graph's order. Blocks are runs of heavy
  nodes; a cut sits between two of them.
* parameters and buffers (get_attr), carried by the blocks whose nodes use them.

A cut is usable when every value crossing it is a tensor whose first dimension is the batch
(so micro-batches split it), and it is a natural one where the module path of the nodes on
either side changes at some depth (a residual block, a decoder layer). Cuts crossed by one
tensor are preferred; the depth is the deepest whose usable cuts still give at most
`max_blocks` blocks, so a GPT-2 falls into its layers and half-layers and a ResNet into its
bottlenecks, never into a convolution and its batch norm.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

import torch
from torch import fx

MIN_BLOCKS = 8
"""Fewer single-tensor cuts than this: cuts crossed by several tensors are allowed too."""
MAX_CROSSING = 4
"""The most tensors a cut may pass when several are allowed."""


@dataclass(frozen=True, slots=True)
class GraphCuts:
    """The heavy nodes in order, and the chosen cuts (positions into `heavy`)."""

    heavy: list[fx.Node]
    free: set[fx.Node]
    cuts: list[int]
    crossing: dict[int, list[fx.Node]]
    """Per usable cut position: the values crossing it, in order of definition."""
    labels: list[str]
    """Per block: the module path its nodes share."""
    begins: list[str]
    """Per block: the module at whose start it begins ('' for the first): where
    torch.distributed.pipelining would place a SplitPoint.BEGINNING for the same cut."""


def module_stack(node: fx.Node) -> tuple[str, ...]:
    """The modules a node was traced in, outermost first (empty in the root's forward)."""
    stack = node.meta.get("nn_module_stack") or {}
    return tuple(str(path) for path, _ in stack.values() if path)


def batch_symbol(graph: fx.Graph) -> object:
    """The symbolic size of the (first) input's first dimension."""
    for node in graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dim() > 0:
                return val.shape[0]
    raise ValueError("the exported graph has no tensor input")


def is_batch(value: object, batch: object) -> bool:
    """Whether `value` is the symbolic batch size `batch`."""
    return isinstance(value, torch.SymInt) and str(value) == str(batch)


def _pure(node: fx.Node) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        seeded = torch.Tag.nondeterministic_seeded in target.tags
        return not (target._schema.is_mutable or seeded)
    return target in (operator.getitem, operator.mul, operator.add, operator.floordiv)


def _parameter_names(graph: fx.Graph) -> set[str]:
    owner = graph.owning_module
    if owner is None:
        return set()
    return {name for name, _ in owner.named_parameters(remove_duplicate=False)}


def classify(graph: fx.Graph) -> tuple[list[fx.Node], set[fx.Node]]:
    """(heavy nodes in order, free nodes); see the module docstring."""
    batch = batch_symbol(graph)
    params = _parameter_names(graph)
    free: set[fx.Node] = set()
    heavy: list[fx.Node] = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            if node.target not in params:
                free.add(node)
            continue
        if node.op == "call_module" and not node.users:
            continue  # export's input guards
        size = node.op == "call_function" and node.target is torch.ops.aten.sym_size.int
        if size and is_batch(node.meta.get("val"), batch):
            free.add(node)
            continue
        inputs = node.all_input_nodes
        if node.users and _pure(node) and all(i in free for i in inputs):
            free.add(node)
            continue
        heavy.append(node)
    return heavy, free


def _crossing_at(
    heavy: list[fx.Node], free: set[fx.Node], position: dict[fx.Node, int]
) -> list[list[fx.Node]]:
    """For each cut k in 1..len(heavy) (len: the output), the values defined before k and
    used at or after it, in order of definition."""
    n = len(heavy)
    last_use: dict[fx.Node, int] = {}
    for node in [*heavy, *(u for h in heavy for u in h.users if u.op == "output")]:
        at = position.get(node, n)
        for i in node.all_input_nodes:
            if i in free or i.op == "get_attr":
                continue
            last_use[i] = max(last_use.get(i, -1), at)
    defined = {v: position.get(v, -1) for v in last_use}
    out: list[list[fx.Node]] = [[] for _ in range(n + 1)]
    for v, used in last_use.items():
        for k in range(defined[v] + 1, min(used, n) + 1):
            out[k].append(v)
    for k in range(n + 1):
        out[k].sort(key=lambda v: defined[v])
    return out


def _splittable(nodes: list[fx.Node], batch: object) -> bool:
    """Whether every value is a tensor micro-batches can split (the batch first, the rest
    static), and several are all floating point (they are packed into one)."""
    vals: list[torch.Tensor] = []
    for v in nodes:
        val = v.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            return False
        vals.append(val)
        if not is_batch(val.shape[0], batch):
            return False
        if not all(isinstance(d, int) for d in val.shape[1:]):
            return False
    return len(vals) < 2 or all(v.dtype.is_floating_point for v in vals)


def choose_cuts(graph: fx.Graph, max_blocks: int = 48) -> GraphCuts:
    """Cut the graph at its natural, batch-splittable boundaries (module docstring)."""
    heavy, free = classify(graph)
    batch = batch_symbol(graph)
    position = {h: k for k, h in enumerate(heavy)}
    crossing = {
        k: nodes
        for k, nodes in enumerate(_crossing_at(heavy, free, position))
        if _splittable(nodes, batch)
    }
    stacks = [module_stack(h) for h in heavy]
    paths = [s[-1] if s else "" for s in stacks]
    depth_of: dict[int, int] = {}
    for k in range(1, len(heavy)):
        if k not in crossing:
            continue
        a, b = stacks[k - 1], stacks[k]
        for depth in range(1, max(len(a), len(b)) + 1):
            if a[:depth] != b[:depth]:
                depth_of[k] = depth
                break
    params = _parameter_names(graph)
    weighted = [
        any(i.op == "get_attr" and i.target in params for i in h.all_input_nodes) for h in heavy
    ]
    cuts = _merge_weightless(_pick(depth_of, crossing, max_blocks), weighted)
    bounds = [0, *cuts, len(heavy)]
    labels = []
    for lo, hi in itertools.pairwise(bounds):
        named = [paths[k] for k in range(lo, hi) if weighted[k]]
        labels.append(_common(named or paths[lo:hi]))
    begins = ["", *(_begins(stacks[k], depth_of[k]) for k in cuts)]
    return GraphCuts(heavy, free, cuts, crossing, labels, begins)


def _pick(
    depth_of: dict[int, int], crossing: dict[int, list[fx.Node]], max_blocks: int
) -> list[int]:
    """The deepest level's cuts that give at most `max_blocks` blocks, single-tensor cuts
    first."""
    best: list[int] = []
    for most in (1, MAX_CROSSING):
        allowed = {k: d for k, d in depth_of.items() if len(crossing[k]) <= most}
        for depth in sorted(set(allowed.values())):
            cuts = sorted(k for k, d in allowed.items() if d <= depth)
            if len(cuts) + 1 > max_blocks:
                break
            best = cuts
        if len(best) + 1 >= MIN_BLOCKS:
            break
    return best


def _begins(stack: tuple[str, ...], depth: int) -> str:
    """The module that starts where a node of `stack` follows one differing at `depth`
    ('' when the node sits in the root's own forward)."""
    return stack[depth - 1] if len(stack) >= depth else ""


def _merge_weightless(cuts: list[int], weighted: list[bool]) -> list[int]:
    """Drop the cuts that would leave a block without parameters (a reshape, an activation,
    a pooling): such a block joins the one before it (the first, the one after), so blocks
    begin where modules do."""
    blocks: list[tuple[int, int, bool]] = []
    for lo, hi in itertools.pairwise([0, *cuts, len(weighted)]):
        has = any(weighted[lo:hi])
        if blocks and (not has or not blocks[-1][2]):
            blocks[-1] = (blocks[-1][0], hi, True if has else blocks[-1][2])
        else:
            blocks.append((lo, hi, has))
    return [lo for lo, _, _ in blocks[1:]]


def _common(paths: list[str]) -> str:
    """The longest module path all of `paths` start with ('model' when none)."""
    split = [p.split(".") for p in paths if p]
    if not split:
        return "model"
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if any(p != parts[0] for p in parts):
            break
        common.append(parts[0])
    return ".".join(common) or "model"
