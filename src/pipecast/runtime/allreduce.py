"""Data parallelism inside a pipeline: a stage's gradients all-reduced over its replicas in
buckets, launched as soon as the stage's last backward is done and awaited before the
optimizer step, so the reduction overlaps the rest of the step's actions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Bucket:
    grads: list[torch.Tensor]
    flat: torch.Tensor
    work: dist.Work


def launch(grads: list[torch.Tensor], group: dist.ProcessGroup, bucket_bytes: int) -> list[Bucket]:
    """Start summing `grads` over `group`, in buckets of about `bucket_bytes`."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for g in grads:
        if size and size + g.numel() * g.element_size() > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(g)
        size += g.numel() * g.element_size()
    launched = []
    for bucket in buckets:
        if not bucket:
            continue
        flat = torch.cat([g.reshape(-1) for g in bucket])
        work = dist.all_reduce(flat, group=group, async_op=True)
        assert work is not None
        launched.append(Bucket(bucket, flat, work))
    return launched


def finish(pending: list[Bucket]) -> None:
    """Wait for every bucket and write the sums back into the gradients."""
    for bucket in pending:
        bucket.work.wait()
        offset = 0
        for g in bucket.grads:
            n = g.numel()
            g.copy_(bucket.flat[offset : offset + n].view_as(g))
            offset += n
