"""The optimizer on the host, stepped block by block beside the backward (ZeRO-Offload's
overlap; RunConfig.offload with the optimizer on the host).

Each parameter's gradient leaves the device as autograd accumulates it (a post-accumulate
hook): it is copied to pinned host memory on a copy stream of its own, and the device's copy
is dropped, so the device never holds the stage's whole gradients, only those in flight. A
host thread sums a parameter's micro-batches in its host gradient, in the order the device
would have summed them (the first copy lands in the sum itself, each later one in a staging
buffer added to it), so the sums are the device's own. Once the step's last backward has
delivered every gradient of a block, the thread steps that block's optimizer while the
device goes on with the blocks below: the host's step, which takes longer than the device's
backward on a large model, runs beside it instead of after it, and only the last block's
step (the stage's first block, which the backward reaches last) is left when the backward
ends. Where the weights are not streamed, the thread then copies each stepped block's new
weights back to the device on a stream of their own.

Steps are per block: Adam's and SGD's updates are per tensor, so stepping a model block by
block is the same arithmetic as stepping it whole. The stage keeps one optimizer (what
learning-rate schedules and checkpoints see), a parameter group per block; a block's step
runs an optimizer of the same kind over that group and the shared optimizer's state.

Where something needs the whole gradients on the device before the step (clipping to a
global norm, loss scaling, all-reducing over replicas) or the hooks cannot run (CUDA graphs
replay without calling them; a split backward writes weight gradients by hand), the engine
leaves the overlap off, and every block is copied out and stepped at the step's end, as
before. Parameters several blocks share are stepped then too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

BESIDE = 2
"""Busy threads beside the host's optimizer step (host_threads)."""


def host_threads() -> int:
    """How many CPU threads the host's optimizer steps with: PIPECAST_HOST_THREADS if set,
    else torch's intra-op count less the two threads busy beside it (the one issuing the
    step's kernels and autograd's, which runs the backward the host's steps overlap): an
    OpenMP team larger than the cores left to it waits at every barrier for a member the
    system has paused."""
    given = os.environ.get("PIPECAST_HOST_THREADS", "")
    return max(1, int(given)) if given.isdigit() else max(1, torch.get_num_threads() - BESIDE)


def _limit_threads() -> None:
    """The host-step thread's own intra-op thread count (OpenMP's count is per thread)."""
    torch.set_num_threads(host_threads())


@dataclass(eq=False)
class _Group:
    """One block's parameters (or the shared ones) and the optimizer that steps them."""

    indices: list[int]
    optimizer: torch.optim.Optimizer
    """Over this group alone; its state and group are the stage optimizer's at each step."""
    left: int = 0
    """Parameters still to deliver their last gradient this step (while armed)."""
    stepped: bool = False


@dataclass(eq=False)
class _Param:
    device: nn.Parameter
    host: nn.Parameter
    grad: torch.Tensor
    """The host's sum of this step's gradients."""
    group: int
    staging: torch.Tensor | None = None
    """Where a later micro-batch's gradient lands before it is added (made on first use)."""
    count: int = 0
    """Gradients delivered this step."""
    added: Future[None] | None = None
    """The host's last work on this parameter's buffers, not yet waited for."""
    done: list[Any] = field(default_factory=list)


class HostStep:
    """The host optimizer of one stage: `blocks` are the stage's blocks, `params` its
    trainable parameters on the device, `host` their host copies (in the same order), and
    `make` builds an optimizer over host parameters (a list, or a list of groups)."""

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        params: Sequence[nn.Parameter],
        host: Sequence[nn.Parameter],
        make: Callable[[Any], torch.optim.Optimizer],
        device: torch.device,
        *,
        streamed: bool,
    ) -> None:
        self.device, self.streamed = device, streamed
        cuda = device.type == "cuda"
        self.out = torch.cuda.Stream(device) if cuda else None  # type: ignore[no-untyped-call]
        self.back = torch.cuda.Stream(device) if cuda else None  # type: ignore[no-untyped-call]
        index = {id(p): i for i, p in enumerate(params)}
        owner: dict[int, int] = {}
        for b, block in enumerate(blocks):
            for p in block.parameters():
                if id(p) in index:
                    owner[id(p)] = -1 if owner.get(id(p), b) != b else b
        members: dict[int, list[int]] = {}
        for p in params:
            members.setdefault(owner.get(id(p), -1), []).append(index[id(p)])
        order = sorted(k for k in members if k >= 0) + ([-1] if -1 in members else [])
        self.groups = [
            _Group(members[k], make([host[i] for i in members[k]])) for k in order
        ]  # fmt: skip
        self.optimizer = make([{"params": [host[i] for i in g.indices]} for g in self.groups])
        """The stage's optimizer over every host parameter, a group per block."""
        self.shared = len(self.groups) - 1 if -1 in members else -1
        """The group of parameters several blocks share (-1: none): stepped at the end."""
        self.params: list[_Param] = [None] * len(params)  # type: ignore[list-item]
        self.index = index
        """id of a device parameter -> its place in `params`."""
        for g, group in enumerate(self.groups):
            for i in group.indices:
                grad = torch.empty(host[i].shape, dtype=host[i].dtype, pin_memory=cuda)
                self.params[i] = _Param(params[i], host[i], grad, g)
                host[i].grad = grad
        self.overlap = False
        """Whether gradients leave as they are produced (the engine decides, per run)."""
        self.armed = False
        """The step's last backward of this stage has begun: a gradient delivered now is a
        parameter's last of the step."""
        self.pool = ThreadPoolExecutor(
            1, thread_name_prefix="pipecast-host-step", initializer=_limit_threads
        )
        self.pending: list[Future[None]] = []
        self.delivered: set[int] = set()
        """ids of the device parameters that got a gradient in the last step."""
        self.lock = threading.Lock()
        self.stepping = (0.0, 0)
        """(seconds, bytes of weights) the optimizer has stepped so far this step; its own
        thread adds to it, the engine's reads it once the step is done."""
        self.last_stepped = (0.0, 0)
        """`stepping` of the last finished step: the host's optimizer rate as the run
        steps it, under the backward's load (RankReport.host_optimizer_rate)."""
        for entry in self.params:
            entry.device.register_post_accumulate_grad_hook(self._delivered)  # type: ignore[no-untyped-call]
        self.begin_step()

    # ---- the engine's calls ---------------------------------------------------------------

    def begin_step(self) -> None:
        self.armed = False
        for group in self.groups:
            group.left, group.stepped = len(group.indices), False
        for p in self.params:
            p.count = 0

    def last_backward(self) -> None:
        """The stage's last backward of the step is about to run."""
        self.armed = self.overlap

    def step(self) -> None:
        """Finish the step: gradients still on the device copied out, every block not yet
        stepped stepped, and the host's work done; the device's weights follow (streamed:
        as the blocks next run)."""
        for p in self.params:  # what the hooks did not take (overlap off, or a hand-made grad)
            if p.device.grad is not None:
                self._take(p, drop=self.overlap)
        for g, group in enumerate(self.groups):
            if not group.stepped:
                self._submit_step(g)
        for future in self.pending:
            future.result()
        self.pending.clear()
        if self.back is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.back)
        self.last_stepped, self.stepping = self.stepping, (0.0, 0)
        self.delivered = {id(p.device) for p in self.params if p.count}
        self.begin_step()

    def last_grad(self, param: nn.Parameter) -> torch.Tensor | None:
        """`param`'s gradient of the last step, as the host summed it (None if it got
        none); valid until the next step's gradients land."""
        if id(param) not in self.delivered:
            return None
        return self.params[self.index[id(param)]].grad

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    # ---- the work -------------------------------------------------------------------------

    def _delivered(self, param: torch.Tensor) -> None:
        """Autograd accumulated a gradient into `param` (the hook, on autograd's thread)."""
        if not self.overlap:
            return
        p = self.params[self.index[id(param)]]
        self._take(p, drop=True)
        if self.armed:
            group = self.groups[p.group]
            group.left -= 1
            if group.left == 0 and p.group != self.shared:
                self._submit_step(p.group)

    def _take(self, p: _Param, *, drop: bool) -> None:
        """Copy `p`'s device gradient out (into the sum for the step's first, else into the
        staging buffer once the host has added the one before); `drop`: and drop the
        device's (kept where CUDA graphs accumulate into its memory: zero_grad zeroes it)."""
        grad = p.device.grad
        assert grad is not None
        first = p.count == 0
        p.count += 1
        if not first and p.staging is None:
            p.staging = torch.empty_like(p.grad, pin_memory=self.out is not None)
        if p.added is not None:  # the staging buffer (or the sum) is free again
            p.added.result()
            p.added = None
        target = p.grad if first else p.staging
        assert target is not None
        done = None
        if self.out is None:
            target.copy_(grad.detach())
        else:
            self.out.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.out):
                target.copy_(grad.detach(), non_blocking=True)
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(self.out)
            grad.record_stream(self.out)
        if drop:
            p.device.grad = None

        def land() -> None:
            if done is not None:
                done.synchronize()
            if not first:
                assert p.staging is not None
                p.grad.add_(p.staging)

        p.added = self._submit(land)

    def _submit_step(self, g: int) -> None:
        group = self.groups[g]
        group.stepped = True
        params = [self.params[i] for i in group.indices]

        def run() -> None:
            for p in params:  # a parameter that got no gradient this step is not stepped
                p.host.grad = p.grad if p.count else None
            group.optimizer.state = self.optimizer.state  # (a checkpoint's load replaces them)
            group.optimizer.param_groups = [self.optimizer.param_groups[g]]
            began = time.perf_counter()
            group.optimizer.step()
            stepped = sum(p.host.numel() * p.host.element_size() for p in params if p.count)
            seconds, nbytes = self.stepping
            self.stepping = (seconds + time.perf_counter() - began, nbytes + stepped)
            if self.streamed:
                return
            if self.back is None:
                with torch.no_grad():
                    for p in params:
                        p.device.copy_(p.host)
                return
            with torch.cuda.stream(self.back), torch.no_grad():
                for p in params:
                    p.device.copy_(p.host, non_blocking=True)

        self._submit(run)

    def _submit(self, fn: Callable[[], None]) -> Future[None]:
        with self.lock:
            future = self.pool.submit(fn)
            self.pending.append(future)
        return future
