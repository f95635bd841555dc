"""The sharded optimizer (ZeRO-1, Megatron's distributed optimizer): where it can run.

Each data-parallel replica keeps the optimizer's state for 1/R of the weights and steps
only those; the weights and gradients stay whole on every replica. After the gradients'
all-reduce, each replica steps its part and sends it to the others (an all-gather of the
weights, as torch's ZeroRedundancyOptimizer broadcasts each part from its owner). The
state is what it shards: Adam's two moments are twice the weights, so at R replicas a
replica holds 2/R of them instead of 2.

It is a choice beside whole copies only: FSDP (Strategy.shard) shards the state with the
weights already, and tensor parallelism's weights are DTensors, which torch's engine
does not broadcast.
"""

from __future__ import annotations


def why_not(replicas: int, shard: str = "none", tp: int = 1) -> str | None:
    """Why the optimizer's state cannot be sharded over `replicas` replicas that hold the
    weights as `shard` says, each split over `tp` tensor-parallel ranks (None: it can)."""
    if replicas < 2:
        return (
            "a sharded optimizer splits its state over data-parallel replicas, and there "
            f"is {replicas}: use 2 or more replicas, or leave the optimizer whole"
        )
    if shard != "none":
        return (
            f"FSDP (shard '{shard}') already shards the optimizer's state with the weights: "
            "shard the optimizer beside whole copies (shard 'none'), or leave it out"
        )
    if tp > 1:
        return (
            f"a sharded optimizer does not run with tensor parallelism (degree {tp}): use "
            "degree 1, or leave the optimizer whole"
        )
    return None
