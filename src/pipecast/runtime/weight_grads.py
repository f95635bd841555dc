"""W's parameter gradients without an autograd call, for the nodes most models' weights
hang off.

W re-enters each captured node with the gradient B saw flowing into it, asking only for its
own parameters (runtime/backward.py). Each such autograd call costs the host more than the
one or two ops it runs, about twice as much in all (docs/decisions.md, "W by the op"). For
these kinds the gradient is the one ATen op the engine would run for that input alone, on the
tensors the node saved, then the reduction the engine applies to a broadcast input:

* AddmmBackward0 / MmBackward0 (nn.Linear, matmul): the weight's gradient as
  mm_mat2_backward computes it (through a TBackward0 where the weight enters transposed),
  the bias's summed to its shape;
* NativeLayerNormBackward0: native_layer_norm_backward with only the weight's and bias's
  outputs asked for;
* AddBackward0 (a bias added on its own): the gradient summed to the bias's shape;
* ConvolutionBackward0 (every nn.Conv*d): convolution_backward with only the weight's and
  bias's outputs asked for.

Anything else (BatchNorm, whose node differs between CPU and cuDNN, another kind, alpha or
beta other than 1, a parameter reached through a cast or a view, a parameter with hooks,
which autograd's accumulation would run) goes through the engine as before. Results equal
the engine's bit for bit on CPU (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.autograd.graph import Node

from pipecast.runtime.autograd_calls import accumulate_into

_ACCUMULATE = "AccumulateGrad"
_TRANSPOSE = "TBackward0"
_aten = torch.ops.aten
Kind = Callable[[Node, torch.Tensor, Sequence[torch.Tensor]], list[torch.Tensor] | None]
"""Each parameter's gradient from a node and the gradient into it, or None (the engine's)."""


def _leaf(edge: tuple[Node | None, int]) -> torch.Tensor | None:
    """The parameter an edge leads straight to, or None."""
    fn = edge[0]
    if fn is None or type(fn).__name__ != _ACCUMULATE:
        return None
    variable: torch.Tensor = fn.variable  # type: ignore[attr-defined]
    return variable


def _through_transpose(edge: tuple[Node | None, int]) -> torch.Tensor | None:
    """The parameter an edge reaches through one transpose (Linear's weight), or None."""
    fn = edge[0]
    if fn is None or type(fn).__name__ != _TRANSPOSE:
        return None
    (child,) = fn.next_functions
    return _leaf(child)


def _reduced(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`grad` summed to a broadcast parameter's shape, as the engine reduces it; a fresh
    tensor always (the captured gradient may feed other nodes' W)."""
    if grad.shape == param.shape:
        return grad.clone()
    return grad.sum_to_size(param.shape)


def _column_major(shape: Sequence[int], stride: Sequence[int]) -> bool:
    return len(shape) == 2 and stride[0] == 1 and stride[1] == shape[0]


def _mat2_grad(grad: torch.Tensor, mat1: torch.Tensor, column_major: bool) -> torch.Tensor:
    """mm_mat2_backward: the gradient of `mat2` in `mat1 @ mat2`, column-major where mat2 is
    (a transposed weight), as autograd computes it. Only mat2's layout matters, not its
    values (a streamed weight's storage may be elsewhere: pipecast.runtime.weight_stream)."""
    if column_major:
        result: torch.Tensor = grad.t().mm(mat1).t()
        return result
    result = mat1.t().mm(grad)
    return result


def _matmul(
    node: Node, grad: torch.Tensor, params: Sequence[torch.Tensor], bias_slot: int | None
) -> list[torch.Tensor] | None:
    """Addmm (bias_slot 0) or Mm (None): each parameter's gradient, or None."""
    edges = node.next_functions
    mat2_slot = 2 if bias_slot is not None else 1
    mat1 = getattr(node, "_saved_mat1" if bias_slot is not None else "_saved_self", None)
    out: list[torch.Tensor] = []
    for p in params:
        if bias_slot is not None and _leaf(edges[bias_slot]) is p:
            out.append(_reduced(grad, p))
        elif mat1 is not None and _through_transpose(edges[mat2_slot]) is p:
            transposed = _column_major(p.shape[::-1], p.stride()[::-1])
            out.append(_mat2_grad(grad, mat1, transposed).t())
        elif mat1 is not None and _leaf(edges[mat2_slot]) is p:
            out.append(_mat2_grad(grad, mat1, _column_major(p.shape, p.stride())))
        else:
            return None
    return out


def _addmm(
    node: Node, grad: torch.Tensor, params: Sequence[torch.Tensor]
) -> list[torch.Tensor] | None:
    if getattr(node, "_saved_alpha", None) != 1 or getattr(node, "_saved_beta", None) != 1:
        return None
    return _matmul(node, grad, params, bias_slot=0)


def _mm(
    node: Node, grad: torch.Tensor, params: Sequence[torch.Tensor]
) -> list[torch.Tensor] | None:
    return _matmul(node, grad, params, bias_slot=None)


def _add(
    node: Node, grad: torch.Tensor, params: Sequence[torch.Tensor]
) -> list[torch.Tensor] | None:
    if getattr(node, "_saved_alpha", None) != 1:
        return None
    edges = node.next_functions
    if not all(_leaf(edges[0]) is p or _leaf(edges[1]) is p for p in params):
        return None
    return [_reduced(grad, p) for p in params]


def _weight_and_bias(op: Callable[..., tuple[torch.Tensor, ...]], saved: tuple[str, ...]) -> Kind:
    """A node whose inputs are (input, weight, bias) and whose backward `op` takes the
    gradient, the node's `saved` tensors and arguments, and a mask of the outputs wanted."""

    def kind(
        node: Node, grad: torch.Tensor, params: Sequence[torch.Tensor]
    ) -> list[torch.Tensor] | None:
        edges = node.next_functions
        weight, bias = _leaf(edges[1]), _leaf(edges[2])
        if not all(p is weight or p is bias for p in params):
            return None
        mask = [False, any(p is weight for p in params), any(p is bias for p in params)]
        _, grad_weight, grad_bias = op(grad, *(getattr(node, f"_saved_{n}") for n in saved), mask)
        return [grad_weight if p is weight else grad_bias for p in params]

    return kind


_LAYER_NORM = ("input", "normalized_shape", "result1", "result2", "weight", "bias")
_CONVOLUTION = (
    "input",
    "weight",
    "bias_sym_sizes_opt",
    "stride",
    "padding",
    "dilation",
    "transposed",
    "output_padding",
    "groups",
)


_KINDS: dict[str, Kind] = {
    "AddmmBackward0": _addmm,
    "MmBackward0": _mm,
    "NativeLayerNormBackward0": _weight_and_bias(_aten.native_layer_norm_backward, _LAYER_NORM),
    "AddBackward0": _add,
    "ConvolutionBackward0": _weight_and_bias(_aten.convolution_backward, _CONVOLUTION),
}


def hooked(p: torch.Tensor) -> bool:
    """Whether autograd's accumulation into `p` would run hooks (which this path skips)."""
    return bool(getattr(p, "_backward_hooks", None)) or bool(
        getattr(p, "_post_accumulate_grad_hooks", None)
    )


def matmul_roles(node: Node, params: Sequence[torch.Tensor]) -> tuple[str, ...] | None:
    """How each of `params` enters the matrix product `node` (an AddmmBackward0 or
    MmBackward0 with alpha and beta 1): 'bias', 'transposed' (a Linear's weight) or
    'plain'; None where it is no such product or any of them enters otherwise."""
    name = type(node).__name__
    if name not in ("AddmmBackward0", "MmBackward0"):
        return None
    bias_slot = 0 if name == "AddmmBackward0" else None
    if bias_slot is not None and (
        getattr(node, "_saved_alpha", None) != 1 or getattr(node, "_saved_beta", None) != 1
    ):
        return None
    edges = node.next_functions
    mat2_slot = 2 if bias_slot is not None else 1
    roles = []
    for p in params:
        if bias_slot is not None and _leaf(edges[bias_slot]) is p and p.dim() == 1:
            roles.append("bias")
        elif _through_transpose(edges[mat2_slot]) is p:
            roles.append("transposed")
        elif _leaf(edges[mat2_slot]) is p:
            roles.append("plain")
        else:
            return None
    return tuple(roles)


def _into_matmul(node: Node, grad: torch.Tensor, params: Sequence[torch.Tensor]) -> bool:
    """Addmm/Mm whose weights already have gradients of their own dtype and layout: add
    each weight's gradient into its .grad inside the matrix product (beta = 1), which
    saves reading and writing the gradient once more per micro-batch; False (nothing
    touched) where any parameter can't be."""
    roles = matmul_roles(node, params)
    if roles is None or grad.dim() != 2:
        return False
    for p in params:
        g = p.grad
        if g is None or g.dtype != grad.dtype or not g.is_contiguous() or g.shape != p.shape:
            return False
    plan = list(zip(params, roles, strict=True))
    # a saved tensor is read once (recomputation's checkpoints allow no second unpack):
    # only now, with every parameter known to take the fused path
    addmm = type(node).__name__ == "AddmmBackward0"
    mat1 = getattr(node, "_saved_mat1" if addmm else "_saved_self", None)
    if mat1 is None:
        return False
    with torch.no_grad():
        for p, how in plan:
            g = p.grad
            assert g is not None
            if how == "bias":
                g.add_(grad.sum(0))
            elif how == "transposed":  # y = x @ W.t(): dW = grad.t() @ x
                g.addmm_(grad.t(), mat1)
            else:  # y = x @ W: dW = x.t() @ grad
                g.addmm_(mat1.t(), grad)
    return True


def accumulate(
    node: Node, grad_outputs: tuple[torch.Tensor | None, ...], params: Sequence[torch.Tensor]
) -> bool:
    """Add `params`' gradients from `node` into their .grad, as the engine would have
    (Linear's weights within their matrix product), or False (nothing touched) where the
    engine must do it."""
    if len(grad_outputs) != 1 or grad_outputs[0] is None or any(hooked(p) for p in params):
        return False
    if type(node).__name__ in ("AddmmBackward0", "MmBackward0") and _into_matmul(
        node, grad_outputs[0], params
    ):
        return True
    found = direct(node, grad_outputs, params)
    if found is None:
        return False
    accumulate_into(params, found)
    return True


def direct(
    node: Node, grad_outputs: tuple[torch.Tensor | None, ...], params: Sequence[torch.Tensor]
) -> list[torch.Tensor] | None:
    """`params`' gradients from `node`, given the gradient that flowed into it in B,
    computed as the engine would, or None where the engine must do it."""
    kind = _KINDS.get(type(node).__name__)
    if kind is None or len(grad_outputs) != 1 or grad_outputs[0] is None:
        return None
    if any(hooked(p) for p in params):
        return None
    grad = grad_outputs[0]
    with torch.no_grad():
        grads = kind(node, grad, params)
    if grads is None:
        return None
    return [g if g.dtype == p.dtype else g.to(p.dtype) for g, p in zip(grads, params, strict=True)]
