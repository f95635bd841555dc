"""Process groups by purpose (pipecast.runtime.channels.cached_group)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
import torch.distributed as dist

from pipecast.errors import PipecastError
from pipecast.planning.schedules.generators import make_plan
from pipecast.runtime import channels


def test_a_group_is_made_once_even_where_this_rank_is_outside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """new_group is collective: every rank asks for every group once, in the same order. A
    rank outside the group gets torch's non-member marker; asked again, it hands back that
    marker without another new_group call, as a member gets its group back."""
    made: list[list[int]] = []

    def new_group(ranks: list[int], **kwargs: Any) -> object:
        made.append(ranks)
        return dist.GroupMember.NON_GROUP_MEMBER

    monkeypatch.setattr(channels, "_GROUPS", {})
    monkeypatch.setattr(channels.dist, "new_group", new_group)
    first = channels.cached_group([2, 1], "tie:w")
    again = channels.cached_group([2, 1], "tie:w")
    assert made == [[1, 2]]
    assert first is again is dist.GroupMember.NON_GROUP_MEMBER


class _PeerGone:
    """A transfer whose peer's process ended, as gloo reports it."""

    def wait(self, timeout: object = None) -> None:
        raise RuntimeError(
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection "
            "closed by peer [127.0.0.1]:28566. This is typically caused by a remote worker "
            "crashing. Check the logs of the remote worker before reporting an error. GLHF! "
            "\U0001f3d6\ufe0f"
        )


def test_a_transfer_that_lost_its_peer_fails_in_pipecasts_words() -> None:
    """Not gloo's text (its source line, its advice, its 'GLHF!'): what failed and how."""
    rank0 = channels.Channels(make_plan("1f1b", 2, 2), 0, 0, 1, torch.device("cpu"), 5.0)
    with pytest.raises(PipecastError) as failed:
        rank0._wait(cast(dist.Work, _PeerGone()))
    assert str(failed.value) == (
        "a transfer failed: the rank at the other end closed the connection (did its process end?)"
    )
