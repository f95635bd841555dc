"""The probe times the host's optimizer step as the runtime runs it."""

from __future__ import annotations

import threading

import pytest
import torch

from pipecast.measuring.probe import host_link


def test_optimizer_rate_steps_on_the_runtimes_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every timed Adam step runs off the calling thread with host_threads() threads: a rate
    timed with torch's whole team prices the runtime's step faster than it runs."""
    monkeypatch.setenv("PIPECAST_HOST_THREADS", "1")
    seen: list[tuple[int, bool]] = []
    step = torch.optim.Adam.step

    def spy(self: torch.optim.Adam, *args: object, **kwargs: object) -> object:
        seen.append(
            (torch.get_num_threads(), threading.current_thread() is threading.main_thread())
        )
        return step(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        rate = host_link.optimizer_rate(nbytes=4096, repeats=2)
    finally:
        torch.set_num_threads(before)
    assert rate > 0
    assert seen == [(1, False)] * 3
