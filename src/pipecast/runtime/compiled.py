"""Compiled stages: each block run as inductor-compiled code, its backward split for B and W.

`compile_blocks` compiles a stage's blocks in place (`nn.Module.compile`, so parameter names
and checkpoints stay as they are) with pipecast's backend: inductor's own pipeline
(decompositions, AOTAutograd, the min-cut partition of what the forward saves, inductor's
code generation and its on-disk cache), with one change at the backward. Where a stage's
backward is split (zero-bubble schedules), each block's backward graph is cut into the
input's gradient and the weights' (pipecast.runtime.compile_split) and each part compiled
on its own:

* inside `splitting()` (B), a compiled block computes its input's gradient only and leaves
  a `PendingWeights` for W: the weight-gradient code and the tensors it reads;
* outside it (a whole backward), it computes both, as torch.compile's own code would.

[Note: which weights a backward belongs to]
One compiled graph serves every block of the same code and shapes (its weights are graph
inputs), so the weights a backward's gradients belong to are those of the call that made
it: the forward marks the autograd node it created with them (`Node.metadata`), and the
backward, running inside that node, reads them back (`torch._C._current_autograd_node`).

The compiled code runs inside pipecast's CUDA graphs like any other kernels: the first
(eager) step compiles, the capture after it records the generated kernels.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._functorch.config as functorch_config
from torch import nn

from pipecast.runtime.compile_split import SplitBackward, split_backward

_PARAMS = "pipecast.compiled.params"
"""Node.metadata key: {backward output position: the weight it is the gradient of}."""
_NODE = "CompiledFunctionBackward"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
Loss = Callable[[torch.Tensor, Any], torch.Tensor]
Backend = Callable[[torch.fx.GraphModule, list[Any]], Any]


def default_cache_dir() -> Path:
    """Where inductor keeps compiled code between runs, unless TORCHINDUCTOR_CACHE_DIR says
    otherwise: beside pipecast's other caches, so a second run compiles nothing."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pipecast" / "inductor"


def use_cache() -> None:
    """Point inductor's cache at pipecast's (a variable already set is left as it is), and
    keep every compiled backward callable on a graph that is kept: AOTAutograd's donated
    buffers (a backward reusing its saved tensors' memory) refuse any call that retains
    the graph, and pipecast's W re-enters kept graphs (backward.py, mesh_backward.py)."""
    os.environ.setdefault(CACHE_ENV, str(default_cache_dir()))
    functorch_config.donated_buffer = False
    # inductor's C++ toolchain on a CPU-only torch warns of a missing CUDA runtime it
    # never needs there, once per rank
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


@dataclass
class PendingWeights:
    """One compiled block's W for one micro-batch: the code and what it reads, and the
    weights its gradients are added into."""

    run_dw: Callable[[list[Any]], Sequence[torch.Tensor | None]] | None
    args: list[Any]
    params: list[torch.Tensor]
    ready: list[torch.Tensor | None] = field(default_factory=list)
    """Gradients already computed (a block compiled without the split), added as they are."""

    def run(self) -> None:
        """Add the block's weight gradients into their .grad, as autograd would."""
        with torch.no_grad():  # as autograd runs a backward: a graph input may be a weight
            grads = list(self.run_dw(self.args)) if self.run_dw is not None else self.ready
        _COUNTS["weights"] += 1
        self.args, self.ready = [], []
        adding: list[torch.Tensor] = []
        added: list[torch.Tensor] = []
        for p, g in zip(self.params, grads, strict=True):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g
            else:
                adding.append(p.grad)
                added.append(g)
        if adding:
            torch._foreach_add_(adding, added)
        self.params = []


# autograd's device threads run the backward nodes: the collector must be visible there,
# so it is one per process, set and read around one synchronous engine call at a time
_SPLIT_STATE: dict[str, list[PendingWeights] | None] = {"pending": None}


_COUNTS = {"whole": 0, "split": 0, "weights": 0}


def counts() -> dict[str, int]:
    """Backwards of compiled blocks this process has run: whole, and split (B, then W)."""
    return dict(_COUNTS)


@contextlib.contextmanager
def splitting() -> Iterator[list[PendingWeights]]:
    """Inside: compiled blocks' backwards compute their input gradients only and leave
    their W in the yielded list, in the order autograd ran them."""
    pending: list[PendingWeights] = []
    outer = _SPLIT_STATE["pending"]
    _SPLIT_STATE["pending"] = pending
    try:
        yield pending
    finally:
        _SPLIT_STATE["pending"] = outer


def marked_params(node: Any) -> dict[int, torch.Tensor] | None:
    """The weights of the compiled call that made autograd node `node`, by backward output
    position; None for a node pipecast's backend did not make."""
    metadata = getattr(node, "metadata", None)
    if not isinstance(metadata, dict):
        return None
    params: dict[int, torch.Tensor] | None = metadata.get(_PARAMS)
    return params


def is_compiled_node(node: Any) -> bool:
    return marked_params(node) is not None


class _Backward:
    """The compiled backward of one block: whole, or split into dI and dW (see the module's
    notes). Called by AOTAutograd with the saved tensors and the output gradients, boxed."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        kwargs: dict[str, Any],
        input_positions: set[int],
        split: bool,
        compile_graph: Callable[..., Any],
    ) -> None:
        self._boxed_call = True  # an instance attribute: the wrappers around it copy it
        self.whole: Any = None
        self.parts: SplitBackward | None = None
        self.di: Any = None
        self.dw: Any = None
        if split:
            parts = split_backward(gm, input_positions)
            if parts.input_grads and parts.weight_grads:
                self.parts = parts
                plain = dict(kwargs, static_input_idxs=())
                self.di = compile_graph(parts.di, _examples(parts.di), **plain)
                self.dw = compile_graph(parts.dw, _examples(parts.dw), **plain)
        if self.parts is None:
            self.whole = compile_graph(gm, example_inputs, **kwargs)

    def post_compile(self, *args: Any, **kwargs: Any) -> None:
        for code in (self.whole, self.di, self.dw):
            if code is not None and hasattr(code, "post_compile"):
                code.post_compile(*args, **kwargs)

    def __call__(self, inputs: list[Any]) -> list[torch.Tensor | None]:
        pending = _SPLIT_STATE["pending"]
        _COUNTS["whole" if pending is None else "split"] += 1
        if self.parts is None:
            grads = list(self.whole(inputs))
            if pending is None:
                return grads
            return self._defer_all(grads, pending)
        parts = self.parts
        args = list(inputs)
        inputs.clear()
        first = list(self.di(list(args)))
        handoffs = first[len(parts.input_grads) :]
        dw_args = [args[i] for i in parts.dw_args] + handoffs
        out: list[torch.Tensor | None] = [None] * parts.outputs
        for position, grad in zip(parts.input_grads, first, strict=False):
            out[position] = grad
        if pending is None:  # a whole backward: W now
            for position, grad in zip(parts.weight_grads, self.dw(dw_args), strict=True):
                out[position] = grad
            return out
        params = _node_params()
        pending.append(PendingWeights(self.dw, dw_args, [params[p] for p in parts.weight_grads]))
        return out

    def _defer_all(
        self, grads: list[torch.Tensor | None], pending: list[PendingWeights]
    ) -> list[torch.Tensor | None]:
        """B on a backward compiled whole: its weight gradients are computed already; W
        adds them (autograd, asked for the input's gradient alone, would drop them)."""
        params = _node_params()
        positions = [i for i in params if i < len(grads) and grads[i] is not None]
        pending.append(
            PendingWeights(None, [], [params[i] for i in positions], [grads[i] for i in positions])
        )
        for i in positions:
            grads[i] = None
        return grads


def _examples(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def _node_params() -> dict[int, torch.Tensor]:
    params = marked_params(torch._C._current_autograd_node())
    if params is None:
        raise RuntimeError("a compiled backward ran outside the node its forward marked")
    return params


def _mark(outputs: Any, params: dict[int, torch.Tensor]) -> None:
    """Tell the autograd node the compiled call made which weights are its (see the
    module's notes). An output AOTAutograd regenerated as a view hangs one node above it."""
    tensors = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    for t in tensors:
        node: Any = t.grad_fn if isinstance(t, torch.Tensor) else None
        for _ in range(2):
            if node is None:
                break
            if type(node).__name__ == _NODE:
                node.metadata[_PARAMS] = params
                break
            node = next((c for c, _ in node.next_functions if c is not None), None)


def backend(
    *, split: bool, budget: float = 1.0
) -> Callable[[torch.fx.GraphModule, list[Any]], Any]:
    """A torch.compile backend: inductor's, with each backward compiled whole or (`split`)
    as dI and dW; `budget`: RunConfig.compile_budget."""

    def compile_module(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        weights = {i for i, e in enumerate(example_inputs) if isinstance(e, nn.Parameter)}
        others = set(range(len(example_inputs))) - weights

        def inner(g: torch.fx.GraphModule, examples: Sequence[Any], **kwargs: Any) -> Any:
            if kwargs.get("is_backward"):
                return _Backward(g, examples, kwargs, others, split, compile_fx_inner)
            return compile_fx_inner(g, examples, **kwargs)

        # AOTAutograd's own cache stores whole compiled pairs, which a split backward is
        # not; inductor's cache of each graph's code still applies
        with functorch_config.patch(enable_autograd_cache=False, activation_memory_budget=budget):
            compiled: Any = compile_fx(gm, example_inputs, inner_compile=inner)

        def run(*args: Any) -> Any:
            out = compiled(*args)
            if torch.is_grad_enabled():
                _mark(out, {i: args[i] for i in weights})
            return out

        return run

    return compile_module


_BACKENDS: dict[tuple[bool, float], Backend] = {}
RECOMPILE_LIMIT = 64
"""Graphs dynamo keeps per code object, for each block compiled in the process: a model's
blocks share their class's forward, and each shape of block (a ResNet stage's width, a
micro-batch size) is one graph of it; torch's default of 8 would send the rest back to
eager. Blocks that are torch's own modules (Conv2d, Linear, Sequential) all enter dynamo
through one wrapper function of torch's, whatever their class: every such block's graphs
count against that one function's limit, hence a budget per block compiled."""
_COMPILED_BLOCKS = [0]
"""Blocks compile_blocks has compiled in this process."""


def compile_blocks(
    module: nn.Sequential, *, split: bool, whole: bool = False, budget: float = 1.0
) -> None:
    """Compile `module`'s blocks in place (`whole`: the stage as one graph); `split`: their
    backwards as dI and dW, for a stage whose backward is split; `budget`:
    RunConfig.compile_budget. One backend object per kind, so blocks of the same code and
    shapes share one compiled graph."""
    use_cache()
    key = (split, budget)
    if key not in _BACKENDS:
        _BACKENDS[key] = backend(split=split, budget=budget)
    chosen = _BACKENDS[key]
    targets = [module] if whole else [b for b in module if _has_work(b)]
    _COMPILED_BLOCKS[0] += len(targets)
    limit = RECOMPILE_LIMIT * _COMPILED_BLOCKS[0]
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, limit)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, limit)
    for block in targets:
        block.compile(backend=chosen, dynamic=False)


def _has_work(block: nn.Module) -> bool:
    """Blocks worth a compiled graph: any with weights or submodules (a bare activation or
    reshape is left to eager)."""
    return any(True for _ in block.parameters()) or any(True for _ in block.children())


def compiled_blocks(module: nn.Module) -> int:
    """How many of `module`'s submodules run compiled (nn.Module.compile)."""
    return sum(1 for m in module.modules() if getattr(m, "_compiled_call_impl", None) is not None)


def compile_loss(loss_fn: Loss, mode: str) -> Loss:
    """The loss, compiled where the stages are (`mode` not 'off'): its cast, softmax and
    reduction fused into a few kernels, with inductor's own backend (it has no weights)."""
    if mode == "off":
        return loss_fn
    use_cache()
    out: Loss = torch.compile(loss_fn, dynamic=False)
    return out
