"""A module captured as one CUDA graph for its forward and one for its whole backward, to
time what its replays cost the device (pipecast.measuring.profiler.graphed).

The input is copied into the capture's own buffer; the backward adds the parameter
gradients to `.grad` (which therefore must keep its address) and returns the input's
gradient. The graphs differentiate fresh leaves that share the parameters' memory: autograd
ends a backward by syncing with the stream each leaf's gradient node was made on, and the
parameters' own were made on the default stream, which no capture may touch. On CPU
(`PIPECAST_GRAPHS_STAND_IN=1`, tests) `SlotStandIn` runs the same passes eagerly.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from pipecast.errors import ConfigError
from pipecast.runtime.autograd_calls import engine_call

Run = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
"""A stage's forward with the given tensors in place of its parameters (by name)."""


class Graphs(Protocol):
    """A stage's per-slot forward and backward (StageGraphs, or SlotStandIn on CPU)."""

    pool_bytes: int
    pool_reserved: int

    def capture(self, sample: torch.Tensor, count: int, input_grad: bool) -> None: ...

    def fits(self, x: torch.Tensor) -> bool: ...

    def forward(self, slot: int, x: torch.Tensor) -> torch.Tensor: ...

    def backward(self, slot: int, grad_out: torch.Tensor | None) -> torch.Tensor | None: ...


def stage_graphs(
    run: Run,
    params: Mapping[str, torch.Tensor],
    buffers: Sequence[torch.Tensor],
    device: torch.device,
) -> Graphs:
    """CUDA graphs for a stage on a GPU; the stand-in on CPU ranks (tests)."""
    if device.type == "cuda":
        return StageGraphs(run, params, buffers, device)
    return SlotStandIn(run, params)


@dataclass
class _Slot:
    forward: torch.cuda.CUDAGraph
    backward: torch.cuda.CUDAGraph
    inp: torch.Tensor
    out: torch.Tensor
    grad_out: torch.Tensor
    grad_in: torch.Tensor | None
    aliases: list[torch.Tensor]
    """The leaves the graph differentiates (the parameters' memory, kept referenced)."""


class _Captured:
    """What a stage's graphs and their stand-in share: the input shape they were captured
    for, and parameter gradients that exist before capture and keep their memory."""

    _shape: tuple[tuple[int, ...], torch.dtype] | None = None

    def _prepare(self, params: Sequence[torch.Tensor], sample: torch.Tensor) -> None:
        for p in params:  # accumulated in place by the graphs: the address must stay
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._shape = (tuple(sample.shape), sample.dtype)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether `x` has the captured input's shape and dtype (a micro-batch of another
        size, where the batch does not divide evenly, runs eagerly)."""
        return self._shape == (tuple(x.shape), x.dtype)


def _aliases(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fresh leaves sharing the parameters' memory (see StageGraphs._capture_one)."""
    return {name: p.detach().requires_grad_(True) for name, p in named.items()}


class StageGraphs(_Captured):
    """The captured forward and backward of one stage, one pair per slot."""

    def __init__(
        self,
        run: Run,
        params: Mapping[str, torch.Tensor],
        buffers: Sequence[torch.Tensor],
        device: torch.device,
    ) -> None:
        """`run(x, weights)`: the stage's forward with `weights` in place of its parameters
        (`params`, by name; those that need gradients)."""
        self.run, self.named, self.device = run, dict(params), device
        self.params, self.buffers = list(self.named.values()), list(buffers)
        self._slots: list[_Slot] = []
        self.pool_reserved = 0
        """Device memory the slots' pools reserved when captured."""
        self.pool_bytes = 0
        """The part of it not allocated: the caching allocator counts a pool's freed blocks
        as reserved, not allocated, though the graphs write there on every replay; the
        slots' fixed inputs, outputs and gradients stay allocated and are counted there."""

    def capture(self, sample: torch.Tensor, count: int, input_grad: bool) -> None:
        """Capture `count` slots for inputs shaped like `sample` (`input_grad`: the stage
        sends its input gradient back). Warms up once on the capture stream first; the
        module's buffers (BatchNorm's running statistics) are put back afterwards."""
        self._prepare(self.params, sample)
        saved = [b.detach().clone() for b in self.buffers]
        grads = [_grad(p).detach().clone() for p in self.params]
        try:
            self._capture_all(sample, count, input_grad)
        finally:  # the warm-up's pass moved BatchNorm's statistics
            with torch.no_grad():
                for b, v in zip(self.buffers, saved, strict=True):
                    b.copy_(v)
                for p, g in zip(self.params, grads, strict=True):
                    _grad(p).copy_(g)

    def _capture_all(self, sample: torch.Tensor, count: int, input_grad: bool) -> None:
        stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            # the warm-up differentiates aliases too: the parameters' own accumulation
            # nodes belong to the default stream, and a backward on this one that reached
            # them would sync the two (autograd warns of the mismatch)
            x = torch.zeros_like(sample).requires_grad_(input_grad)
            leaves = _aliases(self.named)
            out = self.run(x, leaves)
            wanted = [x, *leaves.values()] if input_grad else list(leaves.values())
            torch.autograd.grad(out, wanted, torch.zeros_like(out), allow_unused=True)
            del out, leaves
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        gc.collect()  # nothing of another's may be freed mid-count and read as the pools'
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)
        held = torch.cuda.memory_allocated(self.device)
        for _ in range(count):
            self._slots.append(self._capture_one(sample, input_grad, stream))
        torch.cuda.synchronize(self.device)
        self.pool_reserved = torch.cuda.memory_reserved(self.device) - before
        kept = torch.cuda.memory_allocated(self.device) - held
        self.pool_bytes = max(self.pool_reserved - kept, 0)

    def _capture_one(
        self, sample: torch.Tensor, input_grad: bool, stream: torch.cuda.Stream
    ) -> _Slot:
        pool = torch.cuda.graph_pool_handle()
        fwd, bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        inp = torch.zeros_like(sample).requires_grad_(input_grad)
        # The graph differentiates fresh leaves that share the parameters' memory (so it
        # reads every optimizer update): autograd ends a backward by syncing with the stream
        # each leaf's gradient node was made on, and the parameters' own were made on the
        # default stream in the eager step, which no capture may touch (2 x H100: "operation
        # would make the legacy stream depend on a capturing blocking stream").
        aliases = _aliases(self.named)
        with (
            _views_launch_nothing(),
            torch.cuda.graph(fwd, pool=pool, stream=stream, capture_error_mode="thread_local"),
        ):
            out = self.run(inp, aliases)
        grad_out = torch.zeros_like(out)
        leaves = list(aliases.values())
        wanted = [inp, *leaves] if input_grad else leaves
        with (
            _views_launch_nothing(),
            torch.cuda.graph(bwd, pool=pool, stream=stream, capture_error_mode="thread_local"),
        ):
            # the gradients come back from autograd and are added to .grad inside the graph
            found = engine_call((out,), (grad_out,), wanted, accumulate=False, keep=False)
            grads = found[1:] if input_grad else found
            pairs = [
                (_grad(p), g) for p, g in zip(self.params, grads, strict=True) if g is not None
            ]
            if pairs:
                torch._foreach_add_([a for a, _ in pairs], [b for _, b in pairs])
        grad_in = found[0] if input_grad else None
        return _Slot(fwd, bwd, inp.detach(), out.detach(), grad_out, grad_in, leaves)

    def forward(self, slot: int, x: torch.Tensor) -> torch.Tensor:
        """Replay `slot`'s forward on `x`; the output is the slot's own buffer, valid until
        the slot's next forward."""
        s = self._slots[slot]
        s.inp.copy_(x)
        s.forward.replay()
        return s.out

    def backward(self, slot: int, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        """Replay `slot`'s backward from `grad_out`: parameter gradients accumulate into
        .grad; returns a copy of the input gradient (the slot's next forward may reuse the
        memory while a send still reads it), or None for a first stage."""
        s = self._slots[slot]
        if grad_out is None:
            raise ConfigError("a graphed backward needs its output's gradient")
        s.grad_out.copy_(grad_out)
        s.backward.replay()
        return s.grad_in.clone() if s.grad_in is not None else None


@dataclass
class _StandInSlot:
    inp: torch.Tensor
    out: torch.Tensor | None = None
    grad_in: torch.Tensor | None = None
    live: tuple[torch.Tensor, list[torch.Tensor], torch.Tensor] | None = None


class SlotStandIn(_Captured):
    """What the engine sees of StageGraphs, without CUDA, for tests on CPU ranks
    (`PIPECAST_GRAPHS_STAND_IN=1`): each slot keeps fixed buffers for its input, output and
    input gradient, as a captured graph does, and runs the stage eagerly into them, from
    fresh leaves that share the parameters' memory, adding the gradients to .grad. An engine
    that read a slot's output after the slot's next forward, or zeroed gradients to None,
    gets other numbers than an eager run."""

    def __init__(self, run: Run, params: Mapping[str, torch.Tensor]) -> None:
        self.run, self.named = run, dict(params)
        self.pool_bytes = self.pool_reserved = 0
        self._slots: list[_StandInSlot] = []
        self._input_grad = False

    def capture(self, sample: torch.Tensor, count: int, input_grad: bool) -> None:
        self._prepare(list(self.named.values()), sample)
        self._input_grad = input_grad
        self._slots = [_StandInSlot(torch.zeros_like(sample)) for _ in range(count)]

    def forward(self, slot: int, x: torch.Tensor) -> torch.Tensor:
        s = self._slots[slot]
        s.inp.copy_(x)
        leaf = s.inp.detach().requires_grad_(self._input_grad)
        aliases = _aliases(self.named)
        out = self.run(leaf, aliases)
        s.live = (leaf, list(aliases.values()), out)
        if s.out is None:
            s.out = torch.empty_like(out)
        s.out.copy_(out.detach())
        return s.out

    def backward(self, slot: int, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        s = self._slots[slot]
        if grad_out is None or s.live is None:
            raise ConfigError("a graphed backward needs its forward and its output's gradient")
        leaf, leaves, out = s.live
        wanted = [leaf, *leaves] if self._input_grad else leaves
        found = torch.autograd.grad(out, wanted, grad_out, allow_unused=True)
        grads = found[1:] if self._input_grad else found
        with torch.no_grad():
            for p, g in zip(self.named.values(), grads, strict=True):
                if g is not None:
                    _grad(p).add_(g)
        s.live = None
        if not self._input_grad:
            return None
        if s.grad_in is None:
            s.grad_in = torch.empty_like(found[0])
        s.grad_in.copy_(found[0])
        return s.grad_in.clone()


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        raise ConfigError("a graphed stage's parameter lost its .grad")
    return p.grad


@contextlib.contextmanager
def _views_launch_nothing() -> Iterator[None]:
    """Capturing a block that only reshapes (a Flatten) records no kernel, and torch warns
    that the graph is empty; replaying it does nothing, which is what the block costs, so
    the warning says nothing a user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        yield
