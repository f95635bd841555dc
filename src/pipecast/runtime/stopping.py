"""How a run stops: a signal to the launcher ends its ranks, and ranks outlive no launcher.

SIGTERM (what a scheduler or `timeout` sends) and SIGHUP (a closed terminal) would end the
launcher at once and leave its ranks training, writing checkpoints after the command had
returned. Under `stop_on_signals` they raise `Stopped` instead, as Ctrl-C raises
KeyboardInterrupt, so that the launcher unwinds and ends its ranks on the way out
(launch.spawn) and the command exits 128 + the signal's number. What must not be cut in
half (starting the ranks, ending them) runs `held`: a signal arriving there takes effect
at its end.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOPPING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals that stop a run as Ctrl-C does, but with exit code 128 + their number."""


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds the launcher like KeyboardInterrupt (a
    BaseException, so that no `except Exception` on the way takes it for an error)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum


_held = 0
_pending: list[int] = []


def _raise(signum: int, frame: FrameType | None) -> None:
    if _held:
        _pending.append(signum)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """For the duration: SIGTERM and SIGHUP raise Stopped, SIGINT KeyboardInterrupt (as it
    does by default, but held where `held` holds it), in the main thread. A signal this
    process ignores (SIGHUP under nohup, say) stays ignored. The handlers before are
    restored after; outside the main thread (where Python runs no handler) nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {}
    for signum in (signal.SIGINT, *STOPPING):
        current = signal.getsignal(signum)
        if current is not signal.SIG_IGN:
            before[signum] = current
            signal.signal(signum, _raise)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        _pending.clear()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold the signals that `stop_on_signals` turns into exceptions until the block ends:
    a rank started but not yet known to the launcher, or one it was ending, would be left
    running if the block were cut short. At the end the first signal held takes effect,
    unless the block is already unwinding from another."""
    global _held
    _held += 1
    try:
        yield
    except BaseException:
        if _held == 1:
            _pending.clear()
        raise
    finally:
        _held -= 1
    if not _held and _pending:
        signum = _pending.pop(0)
        _pending.clear()
        _raise(signum, None)
