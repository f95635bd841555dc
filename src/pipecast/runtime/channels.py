"""Point-to-point transfers between stages, deadlock-free for any valid plan.

Every directed pair of ranks that exchanges tensors gets its own process group (a 'channel'),
so a send in one direction never queues behind a receive in the other on a shared NCCL
communicator. On a channel, messages travel in the sender's program order, which every rank
computes from the plan; receivers post `irecv`s in exactly that order, ahead of need. Sends
are non-blocking. With the plan acyclic (the validator checks), no wait can block forever.

Shapes: the first time a step's micro-batch shape is seen, each message is preceded by a
small header (dtype, shape); the shapes are cached per (channel, message index) and later
steps with the same input shape send data only.
"""

from __future__ import annotations

import datetime
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.distributed as dist

from pipecast.errors import PipecastError, RuntimeTimeout
from pipecast.runtime.peer_loss import how_lost
from pipecast.values.parallel import Layout
from pipecast.values.plan.action import Action, Plan

MessageKey = tuple[int, str, int]
"""(producing stage, 'act' or 'grad', micro-batch)."""

_DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]
HEADER = 10  # dtype code, ndim, up to 8 dims


def produced(plan: Plan, action: Action) -> tuple[MessageKey, int] | None:
    """The message an action sends and the stage that consumes it, if it crosses a boundary."""
    last = plan.num_stages - 1
    if action.kind == "F" and action.stage < last:
        return (action.stage, "act", action.mb), action.stage + 1
    if action.kind in ("B", "BW") and action.stage > 0:
        return (action.stage, "grad", action.mb), action.stage - 1
    return None


def channel_orders(plan: Plan) -> dict[tuple[int, int], list[MessageKey]]:
    """(src pipeline rank, dst pipeline rank) -> messages in the order the sender sends them."""
    orders: dict[tuple[int, int], list[MessageKey]] = {}
    for src, actions in enumerate(plan.actions):
        for a in actions:
            made = produced(plan, a)
            if made is None:
                continue
            key, consumer = made
            dst = plan.stage_to_rank[consumer]
            if dst != src:
                orders.setdefault((src, dst), []).append(key)
    return orders


@dataclass
class _Channel:
    group: dist.ProcessGroup | None
    peer: int
    order: list[MessageKey]
    index: dict[MessageKey, int] = field(default_factory=dict)
    posted: int = 0
    pending: dict[MessageKey, tuple[torch.Tensor, dist.Work]] = field(default_factory=dict)


class Channels:
    """The channels of one rank: send what it produces, receive what it consumes."""

    def __init__(
        self,
        plan: Plan,
        pipeline_rank: int,
        replica: int,
        replicas: int,
        device: torch.device,
        timeout_s: float,
        layout: Layout | None = None,
        tensor: int = 0,
        context: int = 0,
    ) -> None:
        """`layout`: where the job's processes sit (values/parallel.py); this rank is
        context- and tensor-parallel rank `context`, `tensor`, and talks to the same one of
        each neighbour."""
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = pipeline_rank
        orders = channel_orders(plan)
        self.outgoing: dict[int, _Channel] = {}
        self.incoming: dict[int, _Channel] = {}
        layout = layout or Layout(replicas=replicas, pipeline=plan.num_ranks)
        # every rank creates every group, in the same order (new_group is collective)
        places = itertools.product(range(layout.tensor), range(replicas), range(layout.context))
        for t, k, c in places:
            for src, dst in sorted(orders):
                ranks = [
                    layout.rank(replica=k, pipeline=src, context=c, tensor=t),
                    layout.rank(replica=k, pipeline=dst, context=c, tensor=t),
                ]
                group = cached_group(ranks, "p2p") if dist.is_initialized() else None
                if (k, c, t) != (replica, context, tensor):
                    continue
                if src == pipeline_rank:
                    self.outgoing[dst] = _Channel(group, ranks[1], orders[(src, dst)])
                if dst == pipeline_rank:
                    self.incoming[src] = _Channel(group, ranks[0], orders[(src, dst)])
        for ch in (*self.outgoing.values(), *self.incoming.values()):
            ch.index = {k: i for i, k in enumerate(ch.order)}
        self.shapes: dict[tuple[int, int], tuple[torch.dtype, tuple[int, ...]]] = {}
        self.targets: dict[MessageKey, torch.Tensor] = {}
        self.with_headers = True
        self.sends: list[tuple[torch.Tensor, dist.Work]] = []
        self.host_seconds = 0.0
        """Host seconds spent in send and recv this step (posting transfers, not waiting for
        them on GPU), which the engine's per-action host times include."""

    def begin_step(
        self, known_shapes: bool, targets: dict[MessageKey, torch.Tensor] | None = None
    ) -> None:
        """Start a step; `known_shapes` when this input shape has been seen before;
        `targets`: the buffers messages land in (CUDA graphs' static inputs), by key."""
        self.with_headers = not known_shapes
        self.targets = targets or {}
        self.host_seconds = 0.0
        for ch in self.incoming.values():
            ch.posted = 0
            ch.pending.clear()

    # ---- send --------------------------------------------------------------------------

    def send(self, dst_rank: int, key: MessageKey, tensor: torch.Tensor) -> None:
        began = time.perf_counter()
        ch = self.outgoing[dst_rank]
        tensor = tensor.detach().contiguous()
        if self.with_headers:
            header = torch.zeros(HEADER, dtype=torch.int64)
            header[0] = _DTYPES.index(tensor.dtype)
            header[1] = tensor.dim()
            header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
            header = header.to(self.device)
            self.sends.append((header, _work(dist.isend(header, ch.peer, group=ch.group))))
        self.sends.append((tensor, _work(dist.isend(tensor, ch.peer, group=ch.group))))
        self._reap()
        self.host_seconds += time.perf_counter() - began

    def _reap(self) -> None:
        """Forget sends that completed, so their tensors can be freed."""
        self.sends = [(t, w) for t, w in self.sends if not w.is_completed()]

    def finish_sends(self) -> None:
        for _, work in self.sends:
            self._wait(work)
        self.sends.clear()

    # ---- receive -----------------------------------------------------------------------

    def prefetch(self) -> None:
        """Post every receive of the step now, in channel order. A receive posted before the
        compute that precedes its use lets the transfer run beside that compute (NCCL orders
        a posted operation after the work its caller's stream holds), but its kernel then
        waits on the GPU for its sender, holding SMs the compute could use."""
        began = time.perf_counter()
        for src, ch in sorted(self.incoming.items()):
            while ch.posted < len(ch.order):
                self._post(src, ch)
        self.host_seconds += time.perf_counter() - began

    def recv(self, src_rank: int, key: MessageKey) -> torch.Tensor:
        """The tensor `key` from `src_rank`, posting receives ahead in channel order."""
        began = time.perf_counter()
        ch = self.incoming[src_rank]
        target = ch.index[key]
        while ch.posted <= target:
            self._post(src_rank, ch)
        tensor, work = ch.pending.pop(key)
        self._wait(work)
        self.host_seconds += time.perf_counter() - began
        return tensor

    def _wait(self, work: dist.Work, *, host: bool = False) -> None:
        """On CPU (gloo) block with the timeout. On GPU make the compute stream wait and
        leave the host free to run ahead; the watchdog catches a transfer that never
        comes, since the host then stalls at its next synchronisation."""
        try:
            if self.device.type == "cuda" and not host:
                work.wait()
            else:
                work.wait(self.timeout)
        except RuntimeError as exc:
            text = str(exc)
            if "timed out" in text.lower() or "timeout" in text.lower():
                seconds = self.timeout.total_seconds()
                raise RuntimeTimeout(f"a transfer did not finish within {seconds:.0f} s") from None
            raise PipecastError(f"a transfer failed: {how_lost(exc)}") from None

    def _post(self, src_rank: int, ch: _Channel) -> None:
        key = ch.order[ch.posted]
        slot = (src_rank, ch.posted)
        if self.with_headers:
            header = torch.empty(HEADER, dtype=torch.int64, device=self.device)
            self._wait(_work(dist.irecv(header, ch.peer, group=ch.group)), host=True)
            values = header.tolist()
            ndim = int(values[1])
            self.shapes[slot] = (
                _DTYPES[int(values[0])],
                tuple(int(v) for v in values[2 : 2 + ndim]),
            )
        if slot not in self.shapes:
            raise PipecastError(f"no shape known for message {ch.posted} from rank {src_rank}")
        dtype, shape = self.shapes[slot]
        buf = self.targets.get(key)
        if buf is None:
            buf = torch.empty(shape, dtype=dtype, device=self.device)
        ch.pending[key] = (buf, _work(dist.irecv(buf, ch.peer, group=ch.group)))
        ch.posted += 1


_GROUPS: dict[tuple[int, tuple[int, ...], str], dist.ProcessGroup] = {}


def cached_group(ranks: list[int], purpose: str, backend: str | None = None) -> dist.ProcessGroup:
    """A process group per (ordered ranks, purpose), created once per world: jobs run one
    after another in the same world (benchmarks) reuse communicators instead of piling them up.
    Every rank asks for the same groups in the same order, so the collective new_group calls
    stay matched. `backend`: another than the world's (gloo, for agreeing on the host)."""
    world = id(dist.group.WORLD)
    key = (world, tuple(ranks), purpose)
    if key not in _GROUPS:
        options = _p2p_options() if purpose == "p2p" and backend is None else None
        # a rank outside `ranks` gets torch's non-member marker, kept so it is asked once
        group = dist.new_group(sorted(ranks), backend=backend, pg_options=options)
        _GROUPS[key] = cast(dist.ProcessGroup, group)
    return _GROUPS[key]


P2P_CTAS_ENV = "PIPECAST_P2P_MAX_CTAS"
"""Experiment: the most CTAs (SMs) a transfer's NCCL kernel may take (unset: NCCL's own)."""


def _p2p_options() -> object | None:
    """NCCL options for the stage-to-stage groups: a kernel waiting for its peer holds its
    SMs, which the stage's compute then lacks."""
    ctas = os.environ.get(P2P_CTAS_ENV)
    if not ctas or dist.get_backend() != "nccl":
        return None
    options = dist.ProcessGroupNCCL.Options()
    options.config.max_ctas = int(ctas)
    options.config.min_ctas = 1
    return options


def _work(work: dist.Work | None) -> dist.Work:
    if work is None:
        raise PipecastError("this rank is not in the transfer's process group")
    return work
