"""A stage's weights in host memory, brought onto the device a block at a time (Harmony's
weight swap; RunConfig.offload = 'weights' or 'all').

The optimizer's copy of the weights (on the host: weight streaming implies the optimizer
there) is the only full one. On the device each streamed parameter keeps its shape but gives
its storage back; a block's forward first makes its own weights resident and starts copying
the next block's in on a copy stream of its own, beside the compute, and every other block's
storage is released. So the device holds two blocks' weights at a time, plus the full
gradients, which accumulate there over the step's micro-batches and leave once, for the
host's optimizer step.

Autograd saves weights (and views of them, a matmul's transpose) for the backward; their
storage is gone by then. The pack hook marks such a tensor with its block, and the unpack
hook makes that block resident again (and prefetches the one below it, which the backward
reaches next) before autograd reads it. The tensor itself is kept, so the view sees the
refilled storage. Refilling a weight does not count as modifying it: its version counter is
preserved, or autograd would reject the saved weights.

Recomputed, a micro-batch saves no weights: checkpoint's own hooks take what its forward
saves, and the recomputed forward saves the weights again, where these hooks can't see them.
So a recomputed stage runs each block with weights as a checkpoint of its own (with the
weightless blocks after it: `recomputed`), and autograd recomputes that group just before
its backward, inside the backward. Its forward pre-hooks make the group's weights resident
and, in a recomputed forward, prefetch the block below (the next the backward reaches), so
its backward finds them where the recomputation left them; the next group's recomputation
releases them. Each micro-batch keeps the input of every group instead of the stage's
input alone, and only one group's activations come back at a time.

A parameter two blocks share (a tied embedding and head) stays resident: no block streams it,
since releasing it with one block would leave the other without it. The host's optimizer
steps it with the rest, so after each step it takes the new weights from the host at once.
On CPU ranks the host copy is a plain tensor, so the same path runs and is tested without a
GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd.grad_mode import _unsafe_preserve_version_counter
from torch.utils.checkpoint import checkpoint

from pipecast.runtime.offload import HostActivations


@dataclass(eq=False)
class _Block:
    index: int
    params: list[nn.Parameter]
    host: list[torch.Tensor]
    resident: bool = True
    ready: torch.cuda.Event | None = None
    """The copy stream's event for a prefetch not yet waited on."""


@dataclass(frozen=True)
class Streamed:
    """A saved weight (or view of one): the tensor and the block whose weights it needs."""

    tensor: torch.Tensor
    block: int


class WeightStream:
    """Streams the weights of `blocks` from `host` (the host copies, in the order of the
    blocks' trainable parameters)."""

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        params: Sequence[nn.Parameter],
        host: Sequence[torch.Tensor],
        device: torch.device,
    ) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]
        copy_of = {id(p): h for p, h in zip(params, host, strict=True)}
        owners: dict[int, int] = {}
        for b, block in enumerate(blocks):
            for p in block.parameters():
                owners[id(p)] = -1 if owners.get(id(p), b) != b else b
        self.blocks: list[_Block] = []
        for b, block in enumerate(blocks):
            own = [p for p in block.parameters() if owners.get(id(p)) == b and id(p) in copy_of]
            self.blocks.append(_Block(b, own, [copy_of[id(p)] for p in own]))
        self.kept = [(p, copy_of[id(p)]) for p in params if owners.get(id(p)) == -1]
        """Weights several blocks share, resident throughout, with their host copies."""
        self._owner: dict[int, int] = {}
        """Storage address of each resident streamed weight -> its block."""
        self.moved_bytes = 0
        """Bytes of weights copied in so far (for the run's report)."""
        self._recomputing = 0
        """Recomputed forwards under way (inside a backward, which goes down the blocks)."""
        for b, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda _m, _a, b=b: self._entering(b))
        self.release_all()

    def _entering(self, index: int) -> None:
        """Block `index`'s forward begins: its weights resident, and the block the pass
        reaches next coming in. In a forward the backward recomputes, that is the nearest
        block with weights below, and a weightless block moves nothing: the group's block
        with weights, before it, must stay for the group's backward."""
        if not self._recomputing:
            self.fetch(index, index + 1)
        elif self.blocks[index].params:
            below = [b for b in range(index) if self.blocks[b].params]
            self.fetch(index, below[-1] if below else -1)

    def recomputed(self, blocks: nn.Sequential, x: Any) -> Any:
        """`blocks` (consecutive blocks of this stream) on `x`, recomputed in the backward a
        group at a time: each block with weights, and the weightless blocks after it, one
        checkpoint (`groups`)."""
        for group in groups(list(blocks)):
            x = checkpoint(self._recomputable(group), x, use_reentrant=False)
        return x

    def _recomputable(self, group: list[nn.Module]) -> Callable[[Any], Any]:
        """`group`'s blocks one after another, for checkpoint: its first call is the
        forward; every later one is a recomputation inside a backward, whose blocks
        prefetch the block below theirs."""
        calls = 0

        def run(x: Any) -> Any:
            for block in group:
                x = block(x)
            return x

        def again(x: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                return run(x)
            self._recomputing += 1
            try:
                return run(x)
            finally:
                self._recomputing -= 1

        return again

    def fetch(self, index: int, following: int) -> None:
        """Make block `index` resident for the compute stream, release every other block
        but `following`, and start bringing `following` in."""
        for b, block in enumerate(self.blocks):
            if b not in (index, following) and block.resident:
                self._release(block)
        self._bring(self.blocks[index])
        self._wait(self.blocks[index])
        if 0 <= following < len(self.blocks):
            self._bring(self.blocks[following])

    def bring_all(self) -> None:
        """Every block resident (to read, save or load the weights), the copies done."""
        for block in self.blocks:
            self._bring(block)
        for block in self.blocks:
            self._wait(block)

    def host_stepped(self) -> None:
        """The host's weights are the new ones (after an optimizer step): every block gives
        its storage back, to bring them in when it next runs, and the resident weights
        several blocks share take theirs now."""
        self.release_all()
        with torch.no_grad():
            for p, h in self.kept:
                p.copy_(h, non_blocking=True)
                self.moved_bytes += p.numel() * p.element_size()

    def release_all(self) -> None:
        """Give back every block's storage (at the start; after the weights were read or set
        whole, StageModule.resident; after an optimizer step, host_stepped)."""
        for block in self.blocks:
            self._release(block)

    def pack(self, tensor: torch.Tensor) -> Streamed | None:
        """`tensor` as a saved weight of a streamed block, or None if it is none."""
        if tensor.device.type != self.device.type:
            return None
        block = self._owner.get(tensor.untyped_storage().data_ptr())
        return None if block is None else Streamed(tensor, block)

    def unpack(self, saved: Streamed) -> torch.Tensor:
        self.fetch(saved.block, saved.block - 1)  # the backward goes down the blocks
        return saved.tensor

    def _bring(self, block: _Block) -> None:
        """Allocate the block's storage and copy its weights in, on the copy stream where
        there is one. The copy waits for the compute issued so far: the memory it fills
        may be what a queued kernel is still reading before the allocator reused it."""
        if block.resident:
            return
        for p in block.params:
            p.untyped_storage().resize_(p.numel() * p.element_size())
            self._owner[p.untyped_storage().data_ptr()] = block.index
        if self.stream is None:
            self._copy(block)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                self._copy(block)
                block.ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
                block.ready.record(self.stream)
        block.resident = True

    def _copy(self, block: _Block) -> None:
        with torch.no_grad():
            for p, h in zip(block.params, block.host, strict=True):
                with _unsafe_preserve_version_counter(p):
                    p.copy_(h, non_blocking=True)
                self.moved_bytes += p.numel() * p.element_size()

    def _wait(self, block: _Block) -> None:
        """The compute stream waits for the block's copy in, if one is outstanding."""
        if block.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(block.ready)
            block.ready = None

    def _release(self, block: _Block) -> None:
        self._wait(block)  # a prefetch never used: finish it before freeing its memory
        for p in block.params:
            self._owner.pop(p.untyped_storage().data_ptr(), None)
            p.untyped_storage().resize_(0)
        block.resident = False


def groups(blocks: Sequence[nn.Module]) -> list[list[nn.Module]]:
    """`blocks` cut before each block with weights: the checkpoints of a recomputed stage
    whose weights are streamed (the weightless blocks before the first with weights join
    it). A group needs one block's weights, and a weightless block alone would only keep
    one more input per micro-batch."""
    out: list[list[nn.Module]] = []
    weighted = False
    """Whether the last group holds a block with weights."""
    for block in blocks:
        has = any(p.requires_grad for p in block.parameters())
        if not out or (has and weighted):
            out.append([block])
            weighted = has
        else:
            out[-1].append(block)
            weighted = weighted or has
    return out


def hooks_of(
    weights: WeightStream | None, activations: HostActivations | None
) -> tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]:
    """Pack and unpack hooks for saved tensors: streamed weights first, then the
    activations' hooks for the rest, if any."""

    def pack(tensor: torch.Tensor) -> Any:
        marked = weights.pack(tensor) if weights is not None else None
        if marked is not None:
            return marked
        return activations.pack(tensor) if activations is not None else tensor

    def unpack(saved: Any) -> torch.Tensor:
        if isinstance(saved, Streamed):
            assert weights is not None
            return weights.unpack(saved)
        if activations is not None:
            out: torch.Tensor = activations.unpack(saved)
            return out
        assert isinstance(saved, torch.Tensor)
        return saved

    return pack, unpack
