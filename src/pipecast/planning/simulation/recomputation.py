"""What recomputation keeps and reruns when every block is a checkpoint of its own, as the
runtime makes each block of a stage FSDP shards (pipecast.runtime.recompute)."""

from __future__ import annotations

from pipecast.values.profile.types import Profile


def block_checkpoints(profile: Profile, start: int, stop: int, micro_batch: int) -> tuple[int, int]:
    """Blocks [start, stop) recomputed a block at a time: (bytes a micro-batch keeps from
    its forward to its backward, each block's input, the stage's received one first; bytes
    the largest block saves, which its backward makes again and holds at once)."""
    kept = profile.stage(start, stop, micro_batch).input_bytes
    kept += sum(profile.cost(i, micro_batch).output_bytes for i in range(start, stop - 1))
    largest = max(profile.cost(i, micro_batch).saved_bytes for i in range(start, stop))
    return kept, largest
