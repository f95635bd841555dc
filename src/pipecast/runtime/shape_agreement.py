"""Every rank learns the step's input shapes from global rank 0, which holds stage 0.

The agreement travels on the host (a gloo group): agreeing through the device would hold up
the step's first kernels behind a device-to-host copy. Rank 0 sends and gets on with the
step (its send is awaited at the step's end); the others wait for the shapes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from pipecast.errors import ConfigError, PipecastError
from pipecast.runtime import microbatch
from pipecast.runtime.channels import cached_group
from pipecast.runtime.peer_loss import how_lost

CODE_LENGTH = 34
"""Integers the shapes travel in: (ndim, *shape) per input tensor, -1 past the end."""


class ShapeAgreement:
    def __init__(self, global_rank: int) -> None:
        self.global_rank = global_rank
        self.group = (
            cached_group(list(range(dist.get_world_size())), "agree", backend="gloo")
            if dist.is_initialized() and dist.get_world_size() > 1
            else None
        )
        self.pending: dist.Work | None = None
        """Rank 0's broadcast of the step's shapes, until it completes."""
        self.key: tuple[int, ...] = ()
        """The step's shapes, as agreed."""
        self.known = False
        """Whether an earlier step had the same shapes."""
        self._seen: set[tuple[int, ...]] = set()

    def agree(self, inputs: Any) -> int:
        """Agree on the step's shapes (`inputs` on rank 0, None elsewhere); the size of the
        first input's first dimension."""
        code = torch.full((CODE_LENGTH,), -1, dtype=torch.int64)
        if inputs is not None:
            flat = [d for shape in microbatch.shapes(inputs) for d in (len(shape), *shape)]
            if len(flat) > CODE_LENGTH:
                raise ConfigError("inputs have too many tensors or dimensions to pipeline")
            code[: len(flat)] = torch.tensor(flat)
        if self.group is not None:
            try:
                work = dist.broadcast(code, src=0, group=self.group, async_op=True)
                assert work is not None
                if self.global_rank == 0:
                    self.pending = work
                else:
                    work.wait()
            except RuntimeError as exc:
                raise PipecastError(
                    f"lost contact with rank 0 while agreeing on the step's "
                    f"input shape: {how_lost(exc)}"
                ) from None
        self.key = tuple(code.tolist())
        self.known = self.key in self._seen
        self._seen.add(self.key)
        if int(code[0]) < 1:
            raise PipecastError("global rank 0 passed no inputs: it holds stage 0")
        return int(code[1])

    def finish(self) -> None:
        """Wait for rank 0's send of this step's shapes."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
