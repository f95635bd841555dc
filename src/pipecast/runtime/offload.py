"""Saved activations in pinned host memory (RunConfig.offload = 'activations').

While a stage's forward runs, every tensor autograd saves for the backward is copied to
pinned host memory on a copy stream of its own, beside the compute; the device memory is
released once its copy is done (the caching allocator waits for the copy stream, through
record_stream). Copies in flight are bounded (values.training.OFFLOAD_IN_FLIGHT): where the
forward outruns the link, it waits for the oldest copy rather than holding every activation
on the device until the copies catch up. The backward brings each tensor back on the compute
stream when autograd unpacks it. Parameters, views of them and the stage's received input
stay where they are: the device holds them anyway. On CPU ranks the "host" copy is a plain
copy, so the same path runs, and is tested, without a GPU.

The simulator prices the same thing (pipecast.planning.simulation.pricing, StageTimes.to_host and
from_host): the copies out overlap the forward, the copies back add to the backward.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pipecast.values.training import OFFLOAD_IN_FLIGHT


class HostActivations:
    """The pack and unpack hooks of one rank."""

    def __init__(self, device: torch.device, in_flight: int = OFFLOAD_IN_FLIGHT) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]
        self.moved_bytes = 0
        """Bytes copied to the host so far (for the run's report)."""
        self.in_flight = in_flight
        self.copies: deque[tuple[Any, int]] = deque()
        """(the event that marks a copy done, its bytes), oldest first: copies under way."""
        self.copying = 0
        """Bytes of the copies in `copies`."""
        self.most_copying = 0
        """The most bytes under way at once (what the bound held it to)."""

    def pack(self, tensor: torch.Tensor) -> Any:
        if (
            (tensor.is_leaf and tensor.requires_grad)  # a weight, or the received input
            or isinstance(tensor._base, nn.Parameter)  # a weight's transpose, saved by a matmul
            or tensor.device.type != self.device.type
        ):
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        self.moved_bytes += nbytes
        if self.stream is None:
            host = tensor.detach().clone()
        else:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                host.copy_(tensor.detach(), non_blocking=True)
            tensor.record_stream(self.stream)  # freed only once the copy is done
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
            self._under_way(done, nbytes)
        return (host, tensor.device, tensor.requires_grad)

    def _under_way(self, done: Any, nbytes: int) -> None:
        """Count a copy just queued; drop those done; past `in_flight` bytes, wait for the
        oldest (all but the newest, if that one alone is more)."""
        self.copies.append((done, nbytes))
        self.copying += nbytes
        while len(self.copies) > 1 and (self.copying > self.in_flight or self.copies[0][0].query()):
            event, size = self.copies.popleft()
            event.synchronize()
            self.copying -= size
        self.most_copying = max(self.most_copying, self.copying)

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        host, device, _ = packed
        if self.stream is not None:
            torch.cuda.current_stream(device).wait_stream(self.stream)
        back: torch.Tensor = host.to(device, non_blocking=True)
        return back

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Autograd saves to the host inside this block."""
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield
