"""The sharded optimizer on torch's engine (pipecast.values.sharded_optimizer says what it
is): each stage's optimizer becomes a ZeroRedundancyOptimizer over the stage's replicas.

Nothing else in the step changes. The engine all-reduces the gradients over the replicas
as for whole copies (pipecast.runtime.allreduce), unscales and clips them; then each
replica's ZeroRedundancyOptimizer steps the parameters it owns (torch assigns each whole
parameter to one replica, largest first, to even out the sizes) with state for those only,
and broadcasts them to the others, so every replica ends the step with the same weights.
Each replica's parameters live in one flat bucket (parameters_as_bucket_view), so a step
broadcasts R buckets rather than one tensor per parameter: the traffic of one all-gather
of the stage's weights, as the simulator prices it (planning.simulation.sharded_optimizer).
Every replica of a stage runs the same stages in the same order (the same pipeline rank),
so their broadcasts pair up.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.optim import Optimizer

from pipecast.errors import ConfigError
from pipecast.runtime.config import RunConfig
from pipecast.runtime.stage import StageModule
from pipecast.values import sharded_optimizer
from pipecast.values.training import offloads_optimizer


def why_not(
    config: RunConfig, replicas: int, shard: str, tp: int, *, checkpoints: bool
) -> str | None:
    """Why a run of `config` over `replicas` replicas cannot shard its optimizer (None: it
    can, or it does not ask to)."""
    if not config.shard_optimizer:
        return None
    if why := sharded_optimizer.why_not(replicas, shard, tp):
        return why
    if offloads_optimizer(config.offload):
        return (
            f"a sharded optimizer steps on the device, and offload '{config.offload}' steps "
            "it on the host: offload the activations only, or leave the optimizer whole"
        )
    if checkpoints:
        return (
            "checkpoints save each stage's optimizer state from one replica, and a sharded "
            "optimizer's is spread over all of them: leave the checkpoints or the sharding out"
        )
    return None


def shard_optimizers(stages: dict[int, StageModule], group: dist.ProcessGroup | None) -> None:
    """Replace each stage's optimizer by one of the same kind and settings that keeps the
    state of this replica's share of the stage's parameters only, over `group` (the
    stage's replicas); its step is collective over them."""
    if group is None:
        raise ConfigError(
            "a sharded optimizer needs the stage's replicas' group: run 2 or more replicas "
            "with whole copies of the weights"
        )
    for st in stages.values():
        whole = st.optimizer
        if whole is None:
            continue
        st.optimizer = ZeroRedundancyOptimizer(
            st.params,
            optimizer_class=type(whole),
            process_group=group,
            parameters_as_bucket_view=True,
            **whole.defaults,
        )


def state_elements(optimizer: Optimizer | None) -> int:
    """Elements of optimizer state this rank holds (a sharded optimizer's share; the step
    counts, one number per parameter, left out)."""
    if optimizer is None:
        return 0
    held = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own
    return sum(
        t.numel()
        for state in held.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
