"""How much memory a stage needs: parameters, gradients, optimizer state and the activations
of the micro-batches its schedule keeps in flight."""

from __future__ import annotations

from pipecast.values.training import OPTIMIZER_STATE, Optimizer


def in_flight(
    schedule: str, position: int, stages: int, microbatches: int, ranks: int | None = None
) -> int:
    """Micro-batches whose activations a stage holds at its peak: all M under GPipe, S - s
    under 1F1B and PipeDream (PipeDream also stashes that many weight versions), S under
    ZB-H1, about S for the V schedule, up to 2S under ZB-auto. Interleaved over `ranks`
    ranks (default S/2): 2R, what a rank's first stage peaks at whatever its count of
    virtual stages (Megatron's warm-up runs 2(R-r-1) + (v-1)R forwards, R a stage in turn,
    so the first stage gets 2R before its first backward); the later stages hold fewer."""
    if schedule == "interleaved":
        return min(microbatches, 2 * ranks if ranks else stages)
    if schedule in ("gpipe",):
        return microbatches
    if schedule in ("1f1b", "pipedream"):
        return min(microbatches, stages - position)
    if schedule == "forward-only":
        return 0
    if schedule == "zb-auto":
        return min(microbatches, 2 * stages)
    return min(microbatches, stages)


def static_bytes(
    param_bytes: float, optimizer: Optimizer, *, stashed_versions: int = 0, state_shards: int = 1
) -> float:
    """Parameters + gradients + optimizer state (+ PipeDream's stashed weight versions); the
    state 1/`state_shards` of it where the replicas shard it (Strategy.shard_optimizer)."""
    state = OPTIMIZER_STATE[optimizer] / state_shards
    return param_bytes * (2.0 + state + stashed_versions)
