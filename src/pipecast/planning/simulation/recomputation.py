"""What recomputation keeps and reruns where every block is a checkpoint of its own: every
block of a stage FSDP shards, and every block under selective recomputation
(pipecast.runtime.recompute)."""

from __future__ import annotations

from dataclasses import replace

from pipecast.errors import ConfigError
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.profile.types import BlockProfile, Profile


def block_checkpoints(profile: Profile, start: int, stop: int, micro_batch: int) -> tuple[int, int]:
    """Blocks [start, stop) recomputed a block at a time: (bytes a micro-batch keeps from
    its forward to its backward, each block's input, the stage's received one first; bytes
    the largest block saves, which its backward makes again and holds at once)."""
    kept = profile.stage(start, stop, micro_batch).input_bytes
    kept += sum(profile.cost(i, micro_batch).output_bytes for i in range(start, stop - 1))
    largest = max(profile.cost(i, micro_batch).saved_bytes for i in range(start, stop))
    return kept, largest


def selective(profile: Profile, cluster: Cluster) -> Profile:
    """`profile` as its blocks run under selective recomputation, each a checkpoint of its
    own (pipecast.runtime.recompute): a block saves its input and what the profiler read it
    keeps (BlockCost.selective_bytes); its backward makes the rest of what it saved again,
    transient beside its own peak, and first reruns the ops that made it (`rerun`). The
    simulator and the partition then price it as a block that saves less and computes a
    longer backward."""
    missing = [b.name for b in profile.blocks if _reading(b) is None]
    if missing:
        raise ConfigError(
            f"profile of {profile.model} has no reading of what selective recomputation keeps "
            f"(block {missing[0]}, and {len(missing) - 1} more; profiled before pipecast "
            "measured it): profile the model again, or recompute 'all'"
        )
    tensor_parallel = {
        degree: _selective_blocks(blocks, cluster)
        for degree, blocks in profile.tensor_parallel.items()
    }
    return replace(
        profile,
        blocks=_selective_blocks(profile.blocks, cluster),
        tensor_parallel=tensor_parallel,
    )


def _reading(block: BlockProfile) -> int | None:
    """The block's selective reading (0 where it saves nothing to begin with)."""
    if all(c.saved_bytes == 0 for c in block.costs.values()):
        return 0
    readings = [c.selective_bytes for c in block.costs.values()]
    return None if any(r is None for r in readings) else sum(r or 0 for r in readings)


def _selective_blocks(
    blocks: tuple[BlockProfile, ...], cluster: Cluster
) -> tuple[BlockProfile, ...]:
    out = []
    for i, block in enumerate(blocks):
        costs = {}
        for size, c in block.costs.items():
            received = (
                blocks[i - 1].costs[size].output_bytes if i and size in blocks[i - 1].costs else 0
            )
            keeps = (c.selective_bytes or 0) + received
            seconds = rerun(c.forward, (block.forward_flops or 0) * size, cluster.matmul_flops)
            share = seconds / c.forward if c.forward > 0 else 1.0
            costs[size] = replace(
                c,
                saved_bytes=keeps,
                peak_bytes=c.peak_bytes + max(c.saved_bytes - keeps, 0),
                backward=c.backward + seconds,
                backward_input=c.backward_input + seconds,
                host_backward=c.host_backward + share * c.host_forward,
                host_backward_input=c.host_backward_input + share * c.host_forward,
            )
        out.append(replace(block, costs=costs, input_counted=i > 0))
    return tuple(out)


def rerun(forward: float, flops: float, matmul_flops: float) -> float:
    """Seconds a selective backward spends making again what the block's forward did not
    keep: the forward's time beyond its matrix products at the GPU's matmul rate (the ops
    it reruns are the ones that are not products: the assumption), none of it below 0;
    where the FLOPs or the rate are unknown, the whole forward (as recomputing all of it)."""
    if flops <= 0 or matmul_flops <= 0:
        return forward
    return max(forward - flops / matmul_flops, 0.0)
