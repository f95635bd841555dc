"""Process groups by purpose (pipecast.runtime.channels.cached_group)."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

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
