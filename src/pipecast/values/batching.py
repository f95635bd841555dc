"""How a step's global batch splits: the one rule every run and every prediction keeps."""

from __future__ import annotations

from pipecast.errors import ConfigError


def check_batch(batch: int, replicas: int, microbatches: int, *, flags: bool = False) -> None:
    """A one-line ConfigError unless `batch` samples feed `replicas` replicas x
    `microbatches` micro-batches: an equal share per replica (a multiple of the replicas),
    at least one sample per micro-batch. A share that does not divide into the
    micro-batches is split as torch.tensor_split splits it, in sizes differing by one
    sample, which the runtime runs and the simulator prices at the largest. `flags`: the
    fix names the CLI's flags (--batch), else the values (a batch)."""
    least = replicas * microbatches
    give = "--batch " if flags else "a batch of "
    fewer = "--micro-batches" if flags else "micro-batches"
    if batch % replicas:
        raise ConfigError(
            f"batch {batch} does not split into {replicas} equal replica shares: make "
            f"{'--batch' if flags else 'the batch'} a multiple of {replicas} (and at least "
            f"{least}), or change the {'--replicas' if flags else 'replicas'}"
        )
    if batch // replicas < microbatches:
        raise ConfigError(
            f"batch {batch} cannot feed {replicas} replica(s) x {microbatches} micro-batches "
            f"of a sample or more (it takes at least {least}): give {give}{least} or more, "
            f"or fewer {fewer}"
        )


def largest_micro_batch(batch: int, replicas: int, microbatches: int) -> int:
    """The largest micro-batch of a `batch` that check_batch passes: a replica's share
    over the micro-batches, rounded up."""
    return -(-(batch // replicas) // microbatches)
