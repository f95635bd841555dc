"""How pipecast makes its autograd calls: straight into the C++ engine, and, where many
calls come together, from the engine's own worker thread for the device.

A split backward makes many small autograd calls: B one per segment, W one per node that
feeds weights (seven per transformer layer), so at small micro-batches their fixed cost is
much of a pipeline's host time. torch.autograd's public functions first check and convert
their arguments in Python; for a GPU tensor the engine then hands the graph's nodes to its
worker thread for that device and the caller waits. `engine_call` skips the first (checked
once, at import, against what the public functions give); `on_engine_thread` lets a batch of
calls run on that thread, nested, without a hand-over each.

[Note: the engine thread's CUDA context]
autograd's worker thread for GPU 0 starts without a current CUDA context: torch sets the
thread's device only where the runtime does not already name it, and a fresh thread's
runtime names device 0, so nothing binds the device's primary context there. A runtime call
that needs one (a kernel launch, a synchronize) binds it on the way; cuBLAS checks first,
and where the thread's first work is a matrix product (a stage whose output is a Linear's,
or a residual added to one: GPT-2's blocks; W's products) it warns "Attempting to run
cuBLAS, but there was no current CUDA context!" and binds it itself. Before its first call
on a GPU, pipecast has that thread synchronize the device (`ready_engine_thread`), which
binds the context without a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

Root = torch.Tensor | GradientEdge


def engine_call(
    roots: Sequence[Root],
    seeds: Sequence[torch.Tensor],
    inputs: Sequence[Root],
    *,
    accumulate: bool,
    keep: bool = True,
) -> tuple[torch.Tensor, ...]:
    """One autograd call, straight into the C++ engine, keeping the graph: with `accumulate`
    the gradients go into the inputs' .grad (as torch.autograd.backward does), else they are
    returned (as torch.autograd.grad does, unreachable inputs as None); `keep=False` frees
    the graph's buffers as it goes, as a plain backward does. Straight in, a call skips the
    public functions' checks and conversions, a fifth of its host cost on a small graph
    (docs/decisions.md, "W by the op"). Seeds must match their roots' shapes;
    nothing here checks them. Where this torch's engine takes no such call, the public
    functions make it."""
    if seeds and seeds[0].is_cuda and seeds[0].get_device() not in _READY:
        ready_engine_thread(seeds[0].get_device())
    if _DIRECT_ENGINE:
        grads: tuple[torch.Tensor, ...] = _ENGINE.run_backward(
            tuple(roots), tuple(seeds), keep, False, tuple(inputs), True, accumulate
        )
        return grads
    todo: Any = list(roots)  # the public signatures take tensors or edges, not a mix
    wanted: Any = list(inputs)
    if accumulate:
        try:
            torch.autograd.backward(todo, list(seeds), retain_graph=keep, inputs=wanted)
            return ()
        except TypeError:  # this torch's backward() takes no GradientEdge: grad() does
            pass
    found = torch.autograd.grad(todo, wanted, list(seeds), retain_graph=keep, allow_unused=True)
    if accumulate:
        accumulate_into(wanted, found)
        return ()
    return tuple(found)


_READY: set[int] = set()
"""GPUs whose autograd worker thread has the device's context current (or is binding it)."""


def ready_engine_thread(index: int) -> None:
    """Bind GPU `index`'s primary context on autograd's worker thread for it, once per
    process (see the note above): the thread synchronizes the device, a runtime call that
    binds the context. Not while a CUDA graph is being captured here (a synchronize would
    break the capture): the next call outside one does it."""
    if index in _READY or torch.cuda.is_current_stream_capturing():
        return
    _READY.add(index)  # before the call below, which comes back through engine_call
    device = torch.device("cuda", index)
    on_engine_thread(lambda: torch.cuda.synchronize(device), device)


def accumulate_into(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    """Add `grads` into `params`' .grad, as autograd's own accumulation would."""
    for p, g in zip(params, grads, strict=True):
        if g is None:
            continue
        if p.grad is None:
            p.grad = g.detach().clone() if g.requires_grad else g
        else:
            p.grad.add_(g)


_ENGINE: Any = getattr(torch.autograd.Variable, "_execution_engine", None)


def _direct_engine_works() -> bool:
    """Whether this torch's engine takes the call `engine_call` makes, edges for roots
    included, and accumulates as torch.autograd.backward would (checked once, on CPU, with
    autograd on whatever mode the importer is in)."""
    if _ENGINE is None:
        return False
    try:
        with torch.inference_mode(False), torch.enable_grad():
            w = torch.ones(2, requires_grad=True)
            y = w * 3.0
            if y.grad_fn is None:
                return False
            edge = GradientEdge(y.grad_fn, 0)
            _ENGINE.run_backward((edge,), (torch.ones(2),), True, False, (w,), True, True)
            (g,) = _ENGINE.run_backward((y,), (torch.ones(2),), True, False, (w,), True, False)
    except (AttributeError, TypeError, RuntimeError):
        return False
    return w.grad is not None and bool((w.grad == 3.0).all()) and bool((g == 3.0).all())


_DIRECT_ENGINE = _direct_engine_works()


class _OnEngineThread(torch.autograd.Function):
    """A one-node graph whose backward calls a given function. For a GPU tensor the
    autograd engine runs that backward on its worker thread for the device, where the
    autograd calls the function makes run nested, on that thread, instead of each being
    handed to it and waited for."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, fn: Callable[[], None]) -> torch.Tensor:
        ctx.fn = fn
        return anchor.view_as(anchor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        ctx.fn()
        return None, None


def on_engine_thread(fn: Callable[[], None], device: torch.device) -> None:
    """fn(), called from the backward of a one-node graph on `device`: on a GPU, from the
    autograd engine's worker thread for it, where the autograd calls fn makes run nested.
    An exception in fn comes out here, as itself."""
    with torch.enable_grad():  # the one-node graph needs recording, whatever the caller's mode
        anchor = torch.empty(0, device=device, requires_grad=True)
        out = _OnEngineThread.apply(anchor, fn)  # type: ignore[no-untyped-call, unused-ignore]
    engine_call((out,), (torch.empty(0, device=device),), (anchor,), accumulate=True, keep=False)
