"""What a block keeps for its backward under selective recomputation, measured.

Selective checkpointing (pipecast.runtime.recompute) keeps the outputs of its policy's ops
in a store of its own, which saved_tensors_hooks do not see: a checkpoint's hooks see only
its input. So the bytes are read as they are left behind: every tensor the block's
forward makes is watched (a weak reference, by storage), and those still alive once the
forward is done, its output aside, are what the store holds for the backward.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from pipecast.measuring.profiler.measure import storages
from pipecast.runtime.recompute import context_fn

if TYPE_CHECKING:
    from pipecast.measuring.profiler.measure import BlockRun


class _Made(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The tensors the ops inside it make: (weak reference, storage, bytes)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.made: list[tuple[weakref.ref[torch.Tensor], int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                for ptr, nbytes in storages(t):
                    self.made.append((weakref.ref(t), ptr, nbytes))
        return out

    def alive(self, *but: torch.Tensor) -> int:
        """Bytes of the storages made inside it that are still alive, `but`'s aside."""
        # (refcounting frees what nothing holds; a full collection here cost seconds per profile)
        skip = {ptr for t in but for ptr, _ in storages(t)}
        live = {ptr: n for ref, ptr, n in self.made if ref() is not None and ptr not in skip}
        return sum(live.values())


def selective_bytes(run: BlockRun) -> int:
    """Bytes the block's forward keeps for its backward as a selective checkpoint of its
    own, beyond its input (which the checkpoint keeps, and the stage counts apart)."""

    def forward(x: torch.Tensor) -> torch.Tensor:  # x: run.leaf, which run.forward reads
        return run.forward()[1]

    with _Made() as made:
        out = checkpoint(forward, run.leaf, use_reentrant=False, context_fn=context_fn("selective"))
    kept: int = made.alive(out)
    del out
    return kept
