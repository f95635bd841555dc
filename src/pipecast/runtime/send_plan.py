"""When to post each send: shortly before its receiver needs it, by the plan's unit clock.

A posted NCCL send waits on the GPU for the matching receive, holding SMs. The receiver
posts only when it reaches the consuming action, so a send posted the moment its tensor exists
would wait through everything the receiver does first. The plan's unit clock
(pipecast.values.plan.clock) gives, for each message, the start of its consumer; the sender posts
it just before its own action that is running at that moment (or at once, if the consumer is
already due).
"""

from __future__ import annotations

import torch

from pipecast.runtime.channels import Channels, MessageKey, produced
from pipecast.values.plan.action import Action, Kind, Plan
from pipecast.values.plan.clock import unit_clock


def post_positions(plan: Plan, rank: int) -> dict[Action, int]:
    """For each cross-rank send of `rank`'s actions: the index in its action list before which
    to post it (one past the producer: post at once)."""
    clock = unit_clock(plan)
    own = plan.actions[rank]
    ends = [clock[a][1] for a in own]
    out: dict[Action, int] = {}
    for i, a in enumerate(own):
        made = produced(plan, a)
        if made is None or plan.stage_to_rank[made[1]] == rank:
            continue
        key, consumer_stage = made
        kind: Kind = "F" if key[1] == "act" else ("B" if plan.split_backward else "BW")
        need = clock.get(Action(consumer_stage, kind, key[2]), (0.0, 0.0))[0]
        post = i + 1
        while post < len(own) and ends[post] <= need:  # that action ends before the need
            post += 1
        out[a] = post
    return out


class Posting:
    """A rank's sends over one step, each posted at its position from `post_positions` (or
    at once: `planned` False, or while the channels still send shape headers)."""

    def __init__(self, plan: Plan, rank: int, channels: Channels, *, planned: bool) -> None:
        self.channels = channels
        self.post_at = post_positions(plan, rank) if planned else {}
        self.position = 0
        """The index of the action the rank is running."""
        self.deferred: dict[int, list[tuple[int, MessageKey, torch.Tensor]]] = {}

    def begin_step(self) -> None:
        self.position = 0
        self.deferred.clear()

    def at(self, position: int) -> None:
        """The rank reaches the action at `position`: post the sends due before it."""
        self.position = position
        for dst, key, tensor in self.deferred.pop(position, []):
            self.channels.send(dst, key, tensor)

    def send(self, a: Action, dst: int, key: MessageKey, tensor: torch.Tensor) -> None:
        """Post `a`'s send now, or where the plan says its receiver is about to need it."""
        post = self.post_at.get(a, self.position + 1)
        if post <= self.position + 1 or self.channels.with_headers:
            self.channels.send(dst, key, tensor)
        else:
            self.deferred.setdefault(post, []).append((dst, key, tensor))

    def flush(self) -> None:
        """Post every deferred send. Called before any blocking receive: a rank never waits
        while holding back a tensor someone may need, so the waits are exactly those of
        eager posting, which the validator proves deadlock-free."""
        for position in sorted(self.deferred):
            for dst, key, tensor in self.deferred.pop(position):
                self.channels.send(dst, key, tensor)
