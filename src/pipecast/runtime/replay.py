"""The engine's graphed path (pipecast.runtime.graphs): the eager step's shapes learnt, every
action of the rank captured after it, and later steps of the same shapes replayed between
static buffers that the transfers read and write."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

import torch

from pipecast.errors import ConfigError, PipecastError
from pipecast.runtime.allreduce import Bucket
from pipecast.runtime.channels import Channels, MessageKey
from pipecast.runtime.config import RunConfig
from pipecast.runtime.events import ActionClock
from pipecast.runtime.gradients import LossScaler
from pipecast.runtime.graphs import Shapes, StepGraphs
from pipecast.runtime.send_plan import Posting
from pipecast.runtime.shape_agreement import ShapeAgreement
from pipecast.runtime.stage import StageModule
from pipecast.runtime.step_result import StepRun, charge, tick
from pipecast.runtime.watchdog import Watchdog
from pipecast.values.plan.action import Action, Plan

PREFETCH_ENV = "PIPECAST_PREFETCH_RECEIVES"
"""Experiment: 1 posts a graphed step's receives at its start (Channels.prefetch)."""


class Engine(Protocol):
    """What the graphed path uses of its engine (pipecast.runtime.engine.PipelineEngine)."""

    plan: Plan
    rank: int
    global_rank: int
    stages: dict[int, StageModule]
    device: torch.device
    config: RunConfig
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor] | None
    scaler: LossScaler
    channels: Channels
    posting: Posting
    watchdog: Watchdog
    clock: ActionClock
    agreement: ShapeAgreement
    stream: torch.cuda.Stream | None

    def reduce_if_done(self, position: int, a: Action, pending: list[Bucket]) -> None: ...


class Replay:
    """One engine's CUDA graphs: the shapes its eager step saw until they are captured,
    then the captured step and the input shape it was captured for."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.shapes: Shapes | None = Shapes()
        """What the eager step saw, until the graphs are captured for it."""
        self.graphs: StepGraphs | None = None
        self.key: tuple[Any, ...] | None = None
        """The step input's shape (ShapeAgreement.key) the graphs were captured for."""

    def ready(self, key: tuple[Any, ...] | None) -> bool:
        """Whether a step of input shape `key` replays the graphs."""
        return self.graphs is not None and key == self.key

    @property
    def captured(self) -> int:
        """How many of the rank's actions were captured as graphs (0: none yet)."""
        return len(self.graphs.programs) if self.graphs is not None else 0

    def learning(self) -> bool:
        """Whether the graphs are still to be captured (after a step that saw the shapes)."""
        return self.shapes is not None and self.graphs is None

    def run(self, in_mbs: list[Any] | None, tg_mbs: list[Any] | None) -> StepRun:
        """The step's actions replayed as the captured graphs, between static buffers that
        the transfers read and write (receives land in them)."""
        e, g = self.engine, self.graphs
        assert g is not None
        plan, run = e.plan, StepRun()
        last = plan.num_stages - 1
        since, replayed = tick(), g.replayed
        if os.environ.get(PREFETCH_ENV) == "1":
            e.channels.prefetch()
        if e.scaler.scale:
            g.scale.fill_(e.scaler.scale)
        if in_mbs is not None:
            for mb, x in enumerate(in_mbs):
                g.buffer(("in", 0, mb)).copy_(x, non_blocking=True)
        if tg_mbs is not None and not plan.forward_only:
            for mb, y in enumerate(tg_mbs):
                g.buffer(("target", last, mb)).copy_(y, non_blocking=True)
        for position, a in enumerate(plan.actions[e.rank]):
            e.posting.at(position)
            s, mb = a.stage, a.mb
            incoming = self._incoming(a)
            if incoming is not None:
                e.posting.flush()  # never wait while holding back what a peer needs
                src, key = incoming
                what = "activation" if key[1] == "act" else "gradient"
                e.watchdog.at(a, f"waiting for the {what} of micro-batch {mb} from rank {src}")
                e.channels.recv(src, key)
            e.watchdog.at(a, "replaying its CUDA graph")
            mark = e.clock.begin()
            g.replay(a)
            e.clock.end(mark, e.global_rank, str(a), a.kind, s, mb)
            if a.kind == "F" and s < last and s + 1 not in e.stages:
                dst = plan.stage_to_rank[s + 1]
                e.posting.send(a, dst, (s, "act", mb), g.buffer(("out", s, mb)))
            elif a.kind in ("B", "BW") and s > 0 and s - 1 not in e.stages:
                dst = plan.stage_to_rank[s - 1]
                e.posting.send(a, dst, (s, "grad", mb), g.buffer(("gin", s, mb)))
            e.reduce_if_done(position, a, run.pending_reduce)
            since = charge(run.host, a.kind, since)
        if last in e.stages:
            if plan.forward_only:
                run.outputs = [
                    g.buffer(("out", last, mb)).clone() for mb in range(plan.num_microbatches)
                ]
            else:
                losses = [g.buffer(("loss", last, mb)) for mb in range(plan.num_microbatches)]
                run.loss_sum = torch.stack(losses).sum()
        run.graphs_replayed = g.replayed - replayed
        return run

    def _incoming(self, a: Action) -> tuple[int, MessageKey] | None:
        """(source rank, message) that action `a` receives from another rank, if any."""
        plan, stages = self.engine.plan, self.engine.stages
        last = plan.num_stages - 1
        if a.kind == "F" and a.stage > 0 and a.stage - 1 not in stages:
            return plan.stage_to_rank[a.stage - 1], (a.stage - 1, "act", a.mb)
        if a.kind in ("B", "BW") and a.stage < last and a.stage + 1 not in stages:
            return plan.stage_to_rank[a.stage + 1], (a.stage + 1, "grad", a.mb)
        return None

    def capture(self, total: int) -> None:
        """Capture every action of this rank for the shapes the eager step just saw, or,
        where a capture fails, stay eager and say why once."""
        e = self.engine
        assert self.shapes is not None
        if self.shapes.unsupported:
            print(f"pipecast: runs eagerly: {self.shapes.unsupported}", file=sys.stderr)
            self.shapes = None
            return
        g = StepGraphs(
            e.plan,
            e.rank,
            e.stages,
            e.device,
            e.config,
            e.loss_fn,
            scaled=bool(e.scaler.scale),
        )
        try:
            g.capture(self.shapes, total, e.stream)
        except (RuntimeError, ConfigError) as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise PipecastError(
                f"capturing rank {e.global_rank}'s actions as CUDA graphs failed "
                f"({type(exc).__name__}: {first}); run without CUDA graphs (--no-cuda-graphs)"
            ) from exc
        self.graphs, self.key, self.shapes = g, e.agreement.key, None
