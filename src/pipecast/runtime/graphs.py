"""CUDA graphs for a whole step: every action of a rank captured as a graph of its own.

Where the host binds (small micro-batches, a split backward's many autograd calls), a step
lasts as long as the host takes to issue its kernels one by one. Replayed as CUDA graphs,
an action costs the host one launch, and the device runs at its own pace.

[Note: capture in the plan's order]
A rank runs the same actions in the same order every step. Captured in that order into one
memory pool, each graph's temporaries take what earlier graphs freed just as the eager
step's allocations would, so a graphed step needs about the memory of an eager one; replayed
in that same order, no graph writes memory that another still needs. What crosses actions
(a forward's saved activations, the gradients B keeps for W) stays allocated from the
capture of its producer to that of its last consumer, as it does in an eager step. Any
schedule, split backwards, recomputation and autocast capture alike.

[Note: static boundaries]
What an action reads from outside its graph or hands to another lives in buffers allocated
before the capture, one per stage and micro-batch (`Buffers`): the data and targets, copied
in; activations and gradients from other ranks, received straight into them (all of a
step's receives posted at its start, `Channels.prefetch`); the stage's output and input
gradient, copied in at the end of its graph and sent from there; the loss. Every
micro-batch has buffers of its own, so uneven micro-batches are graphed too. Parameter
gradients accumulate inside the graphs into `.grad`, which therefore keeps its memory:
graphed stages zero gradients in place, never to None.

The engine runs its first step eagerly (it learns the shapes and initialises the math
libraries), captures after it, and replays every later step with the same shapes; a step
of other shapes runs eagerly. Everything runs on the engine's own stream, eager steps and
captures alike, so autograd's accumulation nodes never change streams. On CPU ranks
`PIPECAST_GRAPHS_STAND_IN=1` has each "graph" re-run its Python body on the same buffers
(tests: the engine's side of the graphs against a single process).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from pipecast.errors import ConfigError, PipecastError
from pipecast.runtime.backward import WeightWork, backward_full, backward_input
from pipecast.runtime.channels import MessageKey
from pipecast.runtime.config import RunConfig
from pipecast.runtime.stage import StageModule
from pipecast.runtime.weight_batch import run_group
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.weight_groups import weight_groups
from pipecast.values.training import offloads_activations, offloads_weights, recomputes

STAND_IN_ENV = "PIPECAST_GRAPHS_STAND_IN"
"""Set to 1 (tests), CPU ranks take `cuda_graphs` with re-run bodies in place of graphs."""


def stand_in() -> bool:
    return os.environ.get(STAND_IN_ENV) == "1"


def unsupported(plan: Plan, config: RunConfig, device: str) -> str | None:
    """Why this run can't replay CUDA graphs (None: it can)."""
    if device != "cuda" and not stand_in():
        return "CUDA graphs need --device cuda"
    if plan.async_updates:
        return "PipeDream's stashed weights change every micro-batch and can't be graphed"
    if offloads_activations(config.offload) and not plan.forward_only:
        return "offloaded activations are copied through host memory, which a graph can't"
    if offloads_weights(config.offload):
        return "streamed weights move in and out of device memory, which a graph can't"
    return None


def enabled(plan: Plan, config: RunConfig, device: str) -> bool:
    """Whether this run replays its steps as graphs: asked for, or by default (None)
    wherever it can on a GPU."""
    if config.cuda_graphs is False:
        return False
    if config.cuda_graphs is None and device != "cuda":
        return False
    return unsupported(plan, config, device) is None


def check(plan: Plan, config: RunConfig, device: str) -> None:
    """ConfigError when `config.cuda_graphs` asks for what this run can't graph."""
    if config.cuda_graphs and (reason := unsupported(plan, config, device)):
        raise ConfigError(f"cuda_graphs: {reason}")


Key = tuple[str, int, int]
"""A static buffer: ('in' | 'out' | 'gout' | 'gin', stage, micro-batch) or
('target' | 'loss', last stage, micro-batch). 'gout' is the gradient of the stage's output,
'gin' of its input."""

Shape = tuple[tuple[int, ...], torch.dtype]


@dataclass
class Shapes:
    """What the eager step saw, per (stage, micro-batch): each forward's input and output,
    and the last stage's targets."""

    inputs: dict[tuple[int, int], Shape] = field(default_factory=dict)
    outputs: dict[tuple[int, int], Shape] = field(default_factory=dict)
    targets: dict[int, Shape] = field(default_factory=dict)
    unsupported: str = ""
    """Why these shapes can't be graphed (empty: they can)."""

    def forward(self, a: Action, x: Any, out: torch.Tensor, target: Any) -> None:
        if not isinstance(x, torch.Tensor) or (target is not None and not _tensor(target)):
            self.unsupported = "a stage's input or the targets are not single tensors"
            return
        self.inputs[(a.stage, a.mb)] = (tuple(x.shape), x.dtype)
        self.outputs[(a.stage, a.mb)] = (tuple(out.shape), out.dtype)
        if target is not None:
            self.targets[a.mb] = (tuple(target.shape), target.dtype)


def _tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


class Program(Protocol):
    def replay(self) -> None: ...


class _Captured:
    """One action's body captured as a CUDA graph into the rank's shared pool."""

    def __init__(self, body: Callable[[], None], pool: Any, stream: torch.cuda.Stream) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            self.graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                body()
            finally:
                self.graph.capture_end()

    def replay(self) -> None:
        self.graph.replay()


class _Rerun:
    """The stand-in: the body itself, run again at every replay."""

    def __init__(self, body: Callable[[], None]) -> None:
        self.body = body

    def replay(self) -> None:
        self.body()


class StepGraphs:
    """One rank's captured step: a program per action, and the buffers they share with the
    engine (see the module's notes)."""

    def __init__(
        self,
        plan: Plan,
        rank: int,
        stages: Mapping[int, StageModule],
        device: torch.device,
        config: RunConfig,
        loss_fn: Callable[[torch.Tensor, Any], torch.Tensor] | None,
        scaled: bool,
    ) -> None:
        self.plan, self.rank, self.stages, self.device = plan, rank, stages, device
        self.config, self.loss_fn, self.scaled = config, loss_fn, scaled
        self.actions = plan.actions[rank]
        self.buffers: dict[Key, torch.Tensor] = {}
        self.programs: dict[Action, Program] = {}
        """The captured actions (an action with nothing to compute has none)."""
        self.replayed = 0
        """Programs replayed so far."""
        self.scale = torch.ones((), device=device)
        """The loss scale the graphs multiply by (set before each step; 1 without scaling)."""
        self.pool_bytes = 0
        """Device bytes the shared pool reserved beyond what stays allocated in it: the
        caching allocator counts a pool's freed blocks as reserved, not allocated, though the
        graphs write there on every replay."""
        self._state: dict[tuple[int, int], Any] = {}
        self._weight_groups = weight_groups(plan)

    # ---- buffers -----------------------------------------------------------------------

    def buffer(self, key: Key) -> torch.Tensor:
        return self.buffers[key]

    def receives(self) -> dict[MessageKey, torch.Tensor]:
        """The buffer each incoming message lands in, by message key."""
        out: dict[MessageKey, torch.Tensor] = {}
        for kind, stage, mb in self.buffers:
            if kind == "in" and stage > 0 and not self._local(stage - 1):
                out[(stage - 1, "act", mb)] = self.buffers[(kind, stage, mb)]
            elif kind == "gout" and not self._local(stage + 1):
                out[(stage + 1, "grad", mb)] = self.buffers[(kind, stage, mb)]
        return out

    def _local(self, stage: int) -> bool:
        return stage in self.stages

    def _allocate(self, shapes: Shapes) -> None:
        last = self.plan.num_stages - 1

        def new(shape: Shape) -> torch.Tensor:
            return torch.zeros(shape[0], dtype=shape[1], device=self.device)

        for a in self.actions:
            s, mb = a.stage, a.mb
            if a.kind == "F":
                if s == 0 or not self._local(s - 1):
                    self.buffers[("in", s, mb)] = new(shapes.inputs[(s, mb)])
                if s < last or self.plan.forward_only:
                    self.buffers[("out", s, mb)] = new(shapes.outputs[(s, mb)])
                if s == last and not self.plan.forward_only:
                    self.buffers[("target", s, mb)] = new(shapes.targets[mb])
                    self.buffers[("loss", s, mb)] = torch.zeros((), device=self.device)
            elif a.kind in ("B", "BW"):
                if s < last and not self._local(s + 1):
                    self.buffers[("gout", s, mb)] = new(shapes.outputs[(s, mb)])
                if s > 0:
                    self.buffers[("gin", s, mb)] = new(shapes.inputs[(s, mb)])

    def _input(self, s: int, mb: int) -> torch.Tensor:
        if ("in", s, mb) in self.buffers:
            return self.buffers[("in", s, mb)]
        return self.buffers[("out", s - 1, mb)]  # the local producer's output

    def _grad_output(self, s: int, mb: int) -> torch.Tensor | None:
        if s == self.plan.num_stages - 1:
            return None
        if ("gout", s, mb) in self.buffers:
            return self.buffers[("gout", s, mb)]
        return self.buffers[("gin", s + 1, mb)]  # the local consumer's input gradient

    # ---- bodies ------------------------------------------------------------------------

    def _body(self, a: Action, total: int) -> Callable[[], None] | None:
        """What action `a` does between its static buffers (None: nothing to do)."""
        st = self.stages[a.stage]
        s, mb, plan = a.stage, a.mb, self.plan
        last = s == plan.num_stages - 1
        # a first stage without trainable weights has neither an input gradient to give nor
        # weight gradients to take: its backward issues no kernel, and a graph of nothing
        # is an error to CUDA ("The CUDA Graph is empty")
        differentiated = s > 0 or bool(st.params)
        if a.kind == "F":
            recompute = recomputes(self.config.recompute, mb, plan.num_microbatches)

            def forward() -> None:
                x = self._input(s, mb)
                if plan.forward_only:
                    with torch.no_grad():
                        self.buffers[("out", s, mb)].copy_(st.forward(x))
                    return
                leaf = x.detach().requires_grad_(True) if s > 0 and x.is_floating_point() else x
                out = st.forward(leaf, recompute=recompute)
                if last:
                    assert self.loss_fn is not None
                    target = self.buffers[("target", s, mb)]
                    loss = self.loss_fn(out, target) * (target.shape[0] / total)
                    self.buffers[("loss", s, mb)].copy_(loss.detach())
                    root = loss * self.scale.to(loss.dtype) if self.scaled else loss
                else:
                    self.buffers[("out", s, mb)].copy_(out.detach())
                    root = out
                if differentiated:
                    self._state[(s, mb)] = (leaf if leaf is not x else None, root)

            return forward
        if a.kind == "W":
            group = self._weight_groups.get(a, ())  # the micro-batches this W computes
            if s == 0 or not st.params or not group:  # the first stage's B is its backward
                return None

            def weights() -> None:
                works: list[list[WeightWork]] = [self._state.pop((s, m)) for m in group]
                run_group(works, self.device, nest=False)

            return weights
        if not differentiated:
            return None

        def backward() -> None:
            leaf, root = self._state.pop((s, mb))
            grad = self._grad_output(s, mb)
            if a.kind == "BW":
                grad_in = backward_full(root, grad, leaf, st.params)
            else:
                grad_in, work = backward_input(root, grad, leaf, st.params)
                if s > 0 and st.params:  # what W computes (the weights body, above)
                    self._state[(s, mb)] = [work]
            if s > 0:
                if grad_in is None:
                    raise PipecastError(f"stage {s}'s output does not depend on its input")
                self.buffers[("gin", s, mb)].copy_(grad_in)

        return backward

    # ---- capture -----------------------------------------------------------------------

    def capture(self, shapes: Shapes, total: int, stream: torch.cuda.Stream | None) -> None:
        """Allocate the buffers for `shapes` and capture every action in the plan's order
        (`total`: the samples of the step over all replicas, which each micro-batch's loss
        is divided by). Each stage's gradients get memory of their own first."""
        for st in self.stages.values():
            for p in st.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        self._allocate(shapes)
        if stream is None:  # the stand-in: bodies run at every replay
            for a in self.actions:
                body = self._body(a, total)
                if body is not None:
                    self.programs[a] = _Rerun(body)
            return
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        pool = torch.cuda.graph_pool_handle()
        try:
            for a in self.actions:
                body = self._body(a, total)
                if body is not None:
                    self.programs[a] = _Captured(body, pool, stream)
        finally:
            self._state.clear()
        torch.cuda.synchronize(self.device)
        kept = torch.cuda.memory_allocated(self.device) - allocated
        self.pool_bytes = max(torch.cuda.memory_reserved(self.device) - reserved - kept, 0)

    def replay(self, a: Action) -> None:
        program = self.programs.get(a)
        if program is not None:
            program.replay()
            self.replayed += 1
