"""`--recompute selective` on the command line: taken by simulate and train, priced where
the profile has its reading, refused in one line where it has none, and a recomputation
that does not exist refused by argparse."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.cli.test_bad_input import PROFILE, check_refused
from tests.planning.simulation.test_selective_pricing import _profile

from pipecast.cli.main import build_parser, main


def test_simulate_prices_selective_recomputation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "profile.json"
    _profile().save(str(path))
    argv = ["simulate", "--profile", str(path), "--stages", "2", "--micro-batches", "4"]
    out_dir = ["--out-dir", str(tmp_path / "out")]
    assert main([*argv, "--recompute", "selective", *out_dir]) == 0
    assert "recompute selective" in capsys.readouterr().out


def test_train_takes_selective_recomputation() -> None:
    args = build_parser().parse_args(
        ["train", "--model", "gpt", "--gpus", "2", "--recompute", "selective"]
    )
    assert args.recompute == "selective"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", *PROFILE, "--stages", "2", "--recompute", "some"], "invalid choice: 'some'"),
        (["train", "--model", "gpt", "--recompute", "half"], "invalid choice"),
        (
            ["simulate", *PROFILE, "--stages", "2", "--recompute", "selective"],
            "profile the model again, or recompute 'all'",
        ),
    ],
)
def test_a_recomputation_it_cannot_run_is_refused_in_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(argv, message, tmp_path, capsys)
