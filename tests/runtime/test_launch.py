"""Ranks started by the launcher (pipecast.runtime.launch): each gets the environment of the
launch that asked for it, and a run that loses a rank says so apart from bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tests.runtime.helpers import pipeline_job

from pipecast.cli import main as cli
from pipecast.errors import ConfigError, PipecastError, RuntimeTimeout
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import (
    Context,
    RankLost,
    free_port,
    lost_contact,
    run_distributed,
    spawn,
)
from pipecast.runtime.outcome import Position
from pipecast.runtime.peer_loss import how_lost
from pipecast.runtime.run import same_checkpoint, where_each_rank_was
from pipecast.runtime.watchdog import Watchdog
from pipecast.runtime.worker import _barrier
from pipecast.values.models import Workload
from pipecast.values.plan.action import Action
from pipecast.values.plan.grid import render_grid

LENET = Workload(model="lenet5", dataset="mnist")
MARK = "PIPECAST_TEST_MARK"


def _environment(ctx: Context, names: list[str]) -> dict[str, str | None]:
    seen = {n: os.environ.get(n) for n in names} | {"threads": str(torch.get_num_threads())}
    dist.barrier()  # rank 0 hosts the rendezvous: it must not leave before the others joined
    return seen


def test_each_rank_gets_the_environment_of_its_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks fork from a server started once and preloaded (launch.PRELOAD); each must see
    the launching process's environment as it is at the launch, not the server's from when
    it started: a variable set or removed since, the launch's own rendezvous port, and
    each rank computing with its share of the cores."""
    names = [MARK, "PIPECAST_TEST_GONE", "MASTER_PORT"]
    monkeypatch.setenv("PIPECAST_TEST_GONE", "before")
    first = spawn(_environment, 2, (names,))  # the fork server runs from here on, if not before
    monkeypatch.setenv(MARK, uuid.uuid4().hex)  # a value no earlier process can hold
    monkeypatch.delenv("PIPECAST_TEST_GONE")
    second = spawn(_environment, 2, (names,))
    assert [seen["PIPECAST_TEST_GONE"] for seen in first] == ["before", "before"]
    for seen in second:
        assert seen[MARK] == os.environ[MARK]
        assert seen["PIPECAST_TEST_GONE"] is None
        assert seen["threads"] == str(max(1, (os.cpu_count() or 1) // 2))
    assert first[0]["MASTER_PORT"] == first[1]["MASTER_PORT"] != second[0]["MASTER_PORT"]
    assert second[0]["MASTER_PORT"] == second[1]["MASTER_PORT"]


def _resume_choices(ctx: Context, jobs: list[TrainJob]) -> str:
    try:
        same_checkpoint(ctx, jobs[ctx.rank])
    except ConfigError as exc:
        return str(exc)
    return "agreed"


def test_ranks_that_would_resume_from_other_checkpoints_stop(tmp_path: Path) -> None:
    """A rank that finds another checkpoint intact than rank 0 does (another node's view
    of the directory, a file changed under the run) would load other weights: every rank
    stops with one line naming both."""
    job = pipeline_job(LENET, "1f1b", 2, 4, [0, 6, 12], steps=3)
    step = tmp_path / "a" / "step-00000001"
    step.mkdir(parents=True)
    meta = {"step": 1, "blocks": 12, "stage_blocks": {}, "optimizer": job.config.optimizer}
    (step / "meta.json").write_text(json.dumps(meta))
    jobs = [
        TrainJob(**{**job.__dict__, "checkpoint": Checkpointing(str(d), resume=True)})
        for d in (tmp_path / "a", tmp_path / "b")
    ]
    told = spawn(_resume_choices, 2, (jobs,))
    assert told[0] == told[1]
    assert f"rank 0 {step}, rank 1 none (from scratch)" in told[0]
    assert spawn(_resume_choices, 2, ([jobs[0], jobs[0]],)) == ["agreed", "agreed"]


def test_where_each_rank_was_marks_their_actions_in_the_grid() -> None:
    plan = pipeline_job(LENET, "1f1b", 2, 4, [0, 6, 12]).plan
    at = {
        0: Position(0, 0, Action.parse("0F2"), "waiting for sends to complete"),
        1: Position(1, 1, Action.parse("1BW0"), "computing the backward"),
        3: Position(3, 1, None, "waiting at the barrier before step 1"),
    }
    text = str(where_each_rank_was(RankLost("rank 2 died", at), plan, range(4)))
    assert text.splitlines()[:6] == [
        "rank 2 died",
        "where each rank was (the action it was on in [brackets]):",
        "  rank 0 (pipeline rank 0): waiting for sends to complete (on 0F2)",
        "  rank 1 (pipeline rank 1): computing the backward (on 1BW0)",
        "  rank 2: no word from it",
        "  rank 3 (pipeline rank 1): waiting at the barrier before step 1",
    ]
    grid = render_grid(plan, marks={0: Action.parse("0F2"), 1: Action.parse("1BW0")})
    assert text.endswith("\n" + grid) and "[0F2]" in grid and "[1BW0]" in grid


def test_the_cli_exits_3_for_a_lost_rank_and_2_for_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def lose(args: object) -> int:
        raise RankLost("rank 1 died (exit code 9) before reporting")

    def refuse(args: object) -> int:
        raise ConfigError("batch 3 cannot feed 4 micro-batches")

    parser = cli.build_parser()
    for raised, code in ((lose, 3), (refuse, 2)):
        monkeypatch.setattr(cli, "build_parser", lambda: parser)
        parser.set_defaults(func=raised)
        assert cli.main([]) == code
        assert capsys.readouterr().err.startswith("pipecast: error: ")
    assert "3 a rank was lost" in " ".join(parser.format_help().split())


def _peer_gone(ctx: Context) -> None:
    try:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    except RuntimeError:
        raise PipecastError("lost contact with another rank at the barrier") from None


def _refuses(ctx: Context) -> None:
    raise ConfigError("batch 3 cannot feed 4 micro-batches")


def test_under_torchrun_a_rank_that_lost_its_peer_says_so_apart_from_bad_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under torchrun no launcher sees a rank die: a rank tells a peer gone (an error while
    torch.distributed's backend failed, or a timeout) from its own bad input by itself."""
    assert lost_contact(RuntimeTimeout("a transfer did not finish within 20 s"))
    assert not lost_contact(ConfigError("batch 3 cannot feed 4 micro-batches"))
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for key, value in (env | {"MASTER_PORT": str(free_port())}).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RankLost, match=r"^rank 0: lost contact with another rank"):
        run_distributed(_peer_gone)
    with pytest.raises(ConfigError) as refused:
        run_distributed(_refuses)
    assert not isinstance(refused.value, RankLost)


def _one_rank_stops(ctx: Context) -> None:
    """Rank 1 stops itself (SIGSTOP: nothing in it runs, its watchdog neither); rank 0
    waits for it at a barrier under a watchdog of one second."""
    with Watchdog(None, ctx.rank, ctx.rank, timeout_s=1.0) as dog:
        dog.at(None, "waiting at the barrier")
        if ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.barrier()


def test_a_rank_that_stopped_is_reported_hung_not_died() -> None:
    """A stopped rank never reports; once rank 0's watchdog has said where it waits, the
    launcher ends the stopped one after the grace, and says that it hung (no progress, no
    report), not that it died with the launcher's own kill's exit code."""
    with pytest.raises(RankLost) as lost:
        spawn(_one_rank_stops, 2, timeout_s=120, grace_s=1.0)
    lines = str(lost.value).splitlines()
    assert re.fullmatch(
        r"rank 0 \(pipeline rank 0\) made no progress for \d+ s: waiting at the barrier", lines[0]
    ), lines
    assert lines[1].startswith("rank 1 hung: it made no progress within the timeout"), lines
    assert "exit code" not in str(lost.value)
    assert set(lost.value.where) == {0}


GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed "
    "by peer [127.0.0.1]:28566. This is typically caused by a remote worker crashing. Check "
    "the logs of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f"
)
"""What torch 2.14's gloo raises on a rank whose peer's process ended, as it printed."""
PEER_ENDED = "the rank at the other end closed the connection (did its process end?)"


def test_a_backends_words_for_a_lost_peer_become_pipecasts() -> None:
    assert how_lost(RuntimeError(GLOO_CLOSED)) == PEER_ENDED
    assert how_lost(RuntimeError("[../gloo/transport/tcp/pair.cc:446] Read timeout [::1]:4")) == (
        "it timed out waiting for the rank at the other end"
    )
    nccl = "NCCL error in: ProcessGroupNCCL.cpp:3010, unhandled cuda error\nLast error: x"
    assert how_lost(RuntimeError(nccl)) == nccl.splitlines()[0]  # not gloo's: kept whole


def _peer_ends(ctx: Context, how: str) -> None:
    """Rank 1 ends as a kill would; rank 0, at a barrier, finds it gone."""
    if ctx.rank == 1:
        os._exit(9)
    if how == "pipecast's barrier":
        _barrier(ctx, "before step 3")
    else:
        with Watchdog(None, 0, 0, timeout_s=60) as dog:
            dog.at(None, "gathering the reports")
            dist.barrier()


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("pipecast's barrier", "lost contact with another rank at the barrier before step 3"),
        ("gloo's own barrier", "lost contact with another rank while gathering the reports"),
    ],
)
def test_a_rank_that_loses_its_peer_says_so_in_pipecasts_words(how: str, says: str) -> None:
    """Where a peer's loss surfaces as gloo's exception, wrapped by pipecast or raised
    straight from a collective, the launcher's first line is pipecast's: which rank, what it
    was doing, how the connection failed; no gloo text, nothing cut mid-word, no
    traceback."""
    with pytest.raises(RankLost) as lost:
        spawn(_peer_ends, 2, (how,), timeout_s=60, grace_s=30)
    text = str(lost.value)
    assert text.splitlines()[0] == f"rank 0: {says}: {PEER_ENDED}"
    assert text.splitlines()[1] == "rank 1 died (exit code 9) before reporting"
    for gloo in ("gloo", "GLHF", "pair.cc", "Traceback"):
        assert gloo not in text
