"""How a run stops: a signal to the launcher ends its ranks, and ranks outlive no launcher.

SIGTERM (what a scheduler or `timeout` sends) and SIGHUP (a closed terminal) would end the
launcher at once and leave its ranks training, writing checkpoints after the command had
returned. Under `stop_on_signals` they raise `Stopped` instead, as Ctrl-C raises
KeyboardInterrupt, so that the launcher unwinds and ends its ranks on the way out
(launch.spawn) and the command exits 128 + the signal's number. What must not be cut in
half (starting the ranks, ending them) runs `held`: a signal arriving there takes effect
at its end.

A launcher killed outright (kill -9) runs nothing on the way out, so each rank watches it
(`end_with_launcher`) and ends itself once the launcher is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

STOPPING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals that stop a run as Ctrl-C does, but with exit code 128 + their number."""

EXIT_ORPHANED = 3
"""A rank whose launcher is gone ends with this code (watchdog.EXIT_LOST's); nobody reads it."""


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


PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal this process gets when the thread that started it ends."""


def end_with_launcher(launcher: int, leftovers: str | None = None) -> None:
    """End this rank once the process `launcher` is gone, whatever ended it, and remove
    `leftovers` (the launcher's folder of rank reports, which nobody will read).

    Two ways, as the rank may have been started by either of two parents. On Linux a
    parent-death signal (SIGKILL, prctl PR_SET_PDEATHSIG) ends it with its parent: the
    launcher where ranks are spawned. Ranks forked from multiprocessing's fork server have
    the server as their parent, and the server stays up while any of them runs (each
    holds the end of the pipe whose closing tells the server that its clients are gone),
    so a thread also waits for the launcher itself to exit (a pidfd, where Linux has one;
    else asking every second) and ends the rank then; the server follows its last rank."""
    _parent_death_signal()
    threading.Thread(
        target=_end_after, args=(launcher, leftovers), daemon=True, name="pipecast-launcher"
    ).start()


def _parent_death_signal() -> None:
    """SIGKILL this process when its parent ends (a no-op off Linux)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _end_after(launcher: int, leftovers: str | None) -> None:
    wait_for_exit(launcher)
    if leftovers:
        shutil.rmtree(leftovers, ignore_errors=True)
    os._exit(EXIT_ORPHANED)


def wait_for_exit(pid: int) -> None:
    """Return once process `pid` has exited (a zombie not yet reaped counts as exited
    where Linux gives a pidfd; elsewhere only once it is gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        select.select([fd], [], [])  # readable once the process has exited
        return
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(1.0)
