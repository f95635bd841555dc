"""A step with the optimizer sharded over the replicas (ZeRO-1, pipecast.values.
sharded_optimizer) in time and memory.

What changes against whole copies, stage by stage over its R replicas:

- memory: each replica keeps the optimizer's state (OPTIMIZER_STATE per weight byte) and
  its step's temporaries for 1/R of the weights; the weights and the gradients stay
  whole, and so does the all-reduce's flat copy of the gradients;
- time: the gradients are all-reduced as before; each replica then steps 1/R of the
  weights (a memory-bound pass over them, so 1/R of the time) and all-gathers the rest,
  which nothing overlaps: the next step's forward needs them.

torch's engine hands out whole parameters, so a replica's share is 1/R only as nearly as
the parameters' sizes allow; it is priced at 1/R.
"""

from __future__ import annotations

from dataclasses import replace

from pipecast.planning.simulation.costs import Costs
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.partition import Partition


def with_sharded_optimizer(costs: Costs, partition: Partition, cluster: Cluster) -> Costs:
    """`costs` with each replicated stage's optimizer sharded over its replicas (the
    stage's devices, replica 0's first): 1/R of the step's time and of the state's memory,
    and an all-gather of the stage's weights after the step."""
    pairs = list(zip(costs.stages, partition.stages, strict=True))
    return replace(
        costs,
        stages=tuple(replace(t, optimizer=t.optimizer / st.replicas) for t, st in pairs),
        weight_gather=tuple(cluster.allgather_time(t.param_bytes, st.devices) for t, st in pairs),
        optimizer_shards=tuple(st.replicas for _, st in pairs),
    )
