"""The context-parallel degrees recommend offers, and the strategies that split each
sequence over them (enumerate.strategies' `context_parallel`).

The rule. A degree c is offered for a profile where all of these hold:

- its model has causal attention whose split context.py prices (context.splittable: the
  zoo's gpt and llama blocks);
- c is a power of two from 2 up to MAX_DEGREE and at most the GPUs;
- the sequence cuts into 2 c equal chunks (the runtime's balanced halves,
  runtime/context.py);
- the sequence is long: attention's quadratic part is at least LONG_SHARE of a block's
  FLOPs (context.attention_share; T >= 4 d for a GPT block, T >= 17 750 tokens for Llama
  3.1 8B's). Why: splitting a sequence cuts each rank's linear work by 1/c, as c more
  replicas would, but adds two collectives of the keys and values a layer; what it buys
  beyond replicas is the sequence's activations and attention's T^2 time split c ways,
  which matter only where they are a large part of the block. Below the share no degree is
  listed, at any batch: the ranking would not be asked about a split that cannot pay for
  its gathers.

Every degree that passes is ranked by its prediction like everything else (rank.py); none
is preferred. Each degree's strategies are those of gpus / c ranks (enumerate.strategies)
that the runtime runs with context parallelism (runtime/job.py's _check_context): whole
copies of the weights (no FSDP, no ZeRO-1 sharded optimizer state), no tensor
parallelism, eagerly (enumerate.graphed leaves them ungraphed), nothing on the host
(rank.py offloads none of them). The runtime splits only the zoo gpt's attention; a
llama's split is priced as torchtitan runs it, and `train` refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from pipecast.planning.recommend.context import attention_share, linear_width, splittable
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

MAX_DEGREE = 16
"""Beyond this many ranks a rank's chunks are short and its gathers long."""
LONG_SHARE = 0.25
"""The least share of a block's FLOPs in attention's quadratic part for a sequence to be
split (the module's docstring)."""


def context_degrees(profile: Profile, gpus: int) -> tuple[int, ...]:
    """The degrees the module's rule offers for `profile` on up to `gpus` GPUs, rising."""
    if not splittable(profile):
        return ()
    seq_len, width = int(profile.workload["seq_len"]), int(profile.workload["width"])
    if attention_share(seq_len, width, linear_width(profile)) < LONG_SHARE:
        return ()
    degrees, c = [], 2
    while c <= min(gpus, MAX_DEGREE):
        if seq_len % (2 * c) == 0:
            degrees.append(c)
        c *= 2
    return tuple(degrees)


def split_sequences(degree: int, strategies: Iterable[Strategy]) -> Iterator[Strategy]:
    """Each of `strategies` (on a 1/`degree` share of the GPUs) that the runtime runs with
    context parallelism, with each sequence split over `degree` GPUs."""
    for s in strategies:
        if s.shard == "none" and s.tp == 1 and not s.shard_optimizer:
            yield replace(s, cp=degree)
