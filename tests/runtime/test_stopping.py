"""A signal to `pipecast train`'s launcher ends every process it started, and ranks outlive
no launcher (runtime.stopping): what a scheduler, `timeout`, a closed terminal or kill -9
leaves behind is nothing but complete checkpoints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pipecast
from pipecast.cli import main as cli
from pipecast.runtime import checkpoint
from pipecast.runtime.stopping import Stopped, held, stop_on_signals, wait_for_exit

PROC = Path("/proc")
on_linux = pytest.mark.skipif(
    not (PROC / "self" / "stat").exists(), reason="finds processes through /proc"
)


def _main_running(
    func: Callable[[object], int],
    monkeypatch: pytest.MonkeyPatch,
) -> int:
    parser = cli.build_parser()
    parser.set_defaults(func=func)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    return cli.main([])


def _signal_self(signum: int) -> Callable[[object], int]:
    def verb(args: object) -> int:
        os.kill(os.getpid(), signum)
        for _ in range(100):  # the handler runs between two of these
            time.sleep(0.05)
        return 0

    return verb


def _interrupted(args: object) -> int:
    raise KeyboardInterrupt


def test_the_cli_exits_130_on_ctrl_c_and_128_plus_the_signal_when_stopped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C: 130 and one line; SIGTERM and SIGHUP arriving while a verb runs: 128 + the
    signal's number (what a shell reports for a process the signal ended) and one line
    naming it, and the handlers in place before come back after."""
    assert _main_running(_interrupted, monkeypatch) == 130
    assert capsys.readouterr().err == "pipecast: interrupted\n"
    seen: list[int] = []

    def guard(signum: int, frame: object) -> None:  # were main not to catch it, seen here
        seen.append(signum)

    for signum, code in ((signal.SIGTERM, 143), (signal.SIGHUP, 129)):
        before = signal.signal(signum, guard)
        try:
            assert _main_running(_signal_self(signum), monkeypatch) == code
            assert signal.getsignal(signum) is guard
        finally:
            signal.signal(signum, before)
        name = signal.Signals(signum).name
        assert capsys.readouterr().err == f"pipecast: stopped by {name}\n"
    assert seen == []


def test_a_signal_held_takes_effect_when_the_block_ends() -> None:
    """Inside `held` (starting or ending the ranks) a signal waits for the block's end, so
    that no rank started or being ended is forgotten half way; an ignored one stays
    ignored."""
    reached = []
    with pytest.raises(Stopped) as stopped, stop_on_signals():
        with held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            reached.append("end of block")
        reached.append("after the block")
    assert reached == ["end of block"]
    assert stopped.value.exit_code == 143
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_on_signals():
            os.kill(os.getpid(), signal.SIGHUP)  # as under nohup: nothing happens
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGHUP, before)


@on_linux
def test_a_launcher_that_exited_counts_as_gone_before_it_is_reaped() -> None:
    """A rank ends once its launcher has exited, even while the launcher's own parent has
    not reaped it yet (a shell busy elsewhere): a zombie answers kill(pid, 0) as if alive."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
    watcher = threading.Thread(target=wait_for_exit, args=(child.pid,), daemon=True)
    watcher.start()
    watcher.join(timeout=30)
    gone = not watcher.is_alive()
    child.wait()
    assert gone


TRAIN = [
    "train", "--model", "lenet5", "--device", "cpu", "--gpus", "2", "--partition", "0,6,12",
    "--batch", "8", "--micro-batches", "2", "--warmup-steps", "0", "--steps", "1000000",
    "--checkpoint-every", "1", "--keep", "2",
]  # fmt: skip
"""Two gloo ranks training far longer than any test waits."""

DEADLINE = 60.0
"""Seconds a test gives the processes to end: generous, for a loaded machine; left running,
they would train for hours."""


def _alive_in_group(pgid: int) -> list[int]:
    """The processes of process group `pgid` still running (an exited one waiting for its
    parent to reap it is not)."""
    alive = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(entry.name))
    return alive


def _parent(pid: int) -> int:
    return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def _until(condition: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


class Launch:
    """`pipecast train` started in its own process group, its output in files."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.checkpoints = tmp_path / "cp"
        self.err = tmp_path / "stderr.txt"
        command = [sys.executable, "-m", "pipecast", *TRAIN, *extra]
        command += ["--checkpoint-dir", str(self.checkpoints), "--out-dir", str(tmp_path)]
        source = str(Path(pipecast.__file__).parents[1])  # the code this test imported
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, *sys.path])}
        with open(tmp_path / "stdout.txt", "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=err, cwd=tmp_path, env=env, start_new_session=True
            )

    def training(self) -> bool:
        """Whether the ranks have written a complete checkpoint (they run)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"exited {self.proc.returncode}: {self.err.read_text()}")
        return checkpoint.latest(self.checkpoints) is not None

    def ranks(self) -> list[int]:
        """The rank processes: in the group, started by another than the launcher (by the
        fork server it started)."""
        group = _alive_in_group(self.proc.pid)
        return [p for p in group if p != self.proc.pid and _parent(p) != self.proc.pid]

    def left(self) -> list[int]:
        return [p for p in _alive_in_group(self.proc.pid) if p != self.proc.pid]

    def end(self) -> None:
        """Kill whatever is left of the group (the test failed)."""
        if self.proc.poll() is None or self.left():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def launch(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Launch]:
    """`pipecast train` running (a checkpoint written), with the test's `extra` options."""
    run = Launch(tmp_path, *getattr(request, "param", ()))
    try:
        assert _until(run.training, 240), "no checkpoint within 240 s"
        yield run
    finally:
        run.end()


@on_linux
@pytest.mark.slow
def test_a_signal_to_the_launcher_ends_every_process_it_started(launch: Launch) -> None:
    """SIGTERM goes to the launcher alone (as `timeout` or a scheduler sends it): it exits
    143 with one line, no rank, fork server or resource tracker of its group stays, and the
    checkpoint directory holds complete checkpoints only (a step the ranks were writing,
    stood for by one planted without meta.json, is removed). SIGHUP takes the same path
    (stopping.STOPPING) to its own code and line, which the first test of this module
    checks without starting ranks."""
    assert len(launch.ranks()) == 2
    half = checkpoint.step_dir(launch.checkpoints, 10**7)
    half.mkdir()
    (half / "stage-000.pt").write_bytes(b"half written")
    os.kill(launch.proc.pid, signal.SIGTERM)
    assert launch.proc.wait(timeout=DEADLINE) == 143
    assert _until(lambda: not launch.left(), DEADLINE), launch.left()
    lines = [s for s in launch.err.read_text().splitlines() if s.strip()]
    assert lines == ["pipecast: stopped by SIGTERM"]
    steps = sorted(launch.checkpoints.iterdir())
    assert steps and not half.exists()
    assert all((step / checkpoint.META).exists() for step in steps), steps
    saved = checkpoint.latest(launch.checkpoints)
    assert saved is not None and saved.passed_over == ()


@on_linux
@pytest.mark.slow
def test_ranks_end_themselves_when_the_launcher_is_killed(launch: Launch) -> None:
    """kill -9 runs nothing in the launcher: each rank sees it gone and ends, and the fork
    server and resource tracker, their last client gone, follow."""
    ranks = launch.ranks()
    assert len(ranks) == 2
    os.kill(launch.proc.pid, signal.SIGKILL)
    assert launch.proc.wait(timeout=DEADLINE) == -signal.SIGKILL
    assert _until(lambda: not launch.left(), DEADLINE), launch.left()


@on_linux
@pytest.mark.slow
@pytest.mark.parametrize("launch", [("--timeout", "5")], indirect=True)
def test_a_stopped_rank_is_reported_hung(launch: Launch) -> None:
    """A rank stopped with SIGSTOP (its watchdog stopped too): the other rank's watchdog
    says where it waits, the launcher ends the stopped one after the grace and reports it
    hung, not "died (exit code -9)" of the launcher's own kill; exit 3, nothing left."""
    stopped = launch.ranks()[0]
    os.kill(stopped, signal.SIGSTOP)
    assert launch.proc.wait(timeout=DEADLINE + 5 + 15) == 3
    err = launch.err.read_text()
    assert re.search(
        r"^(pipecast: error: )?rank \d hung: it made no progress within the", err, re.M
    ), err
    assert "exit code" not in err
    assert _until(lambda: not launch.left(), DEADLINE), launch.left()
