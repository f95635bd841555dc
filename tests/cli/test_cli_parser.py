"""What argparse says: its errors read as pipecast's own, and every option explains itself."""

from __future__ import annotations

import argparse

import pytest

from pipecast.cli.main import build_parser, main


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["train", "--model"],
            "pipecast: error: argument --model: expected one argument (pipecast train --help)",
        ),
        (
            ["train", "--model", "lenet5", "--bogus", "1"],
            "pipecast: error: unrecognized arguments: --bogus 1 (pipecast train --help)",
        ),
        (
            ["simulate"],
            "pipecast: error: the following arguments are required: --profile, --stages "
            "(pipecast simulate --help)",
        ),
        (
            ["report", "--trace"],
            "pipecast: error: argument --trace: expected one argument (pipecast report --help)",
        ),
        (["--bogus"], "pipecast: error: unrecognized arguments: --bogus (pipecast --help)"),
    ],
)
def test_an_argparse_error_is_one_line_like_pipecasts_own(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pipecast: error: <what>` and exit 2, as a PipecastError prints, with no usage block:
    the hint names the help of the verb whose option it was, not the top level's."""
    assert _refused(argv, capsys) == line + "\n"


def test_an_unknown_verb_names_the_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["frob"], capsys)
    assert err.startswith("pipecast: error: argument <verb>: invalid choice: 'frob'")
    assert "'train'" in err and err.endswith("(pipecast --help)\n") and err.count("\n") == 1


def _unexplained(parser: argparse.ArgumentParser, prog: str) -> list[str]:
    """Every option of `parser` and of each verb's parser under it that `--help` would show
    without a word of help (-h aside)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                found += _unexplained(sub, f"{prog} {verb}")
        elif action.help is None and not isinstance(action, argparse._HelpAction):
            found.append(f"{prog} {'/'.join(action.option_strings) or action.dest}")
    return found


def test_every_option_of_every_verb_has_help() -> None:
    assert _unexplained(build_parser(), "pipecast") == []


def test_infer_offers_no_training_options(capsys: pytest.CaptureFixture[str]) -> None:
    """A forward-only run steps no optimizer and recomputes nothing: `infer` does not take
    options that would change nothing."""
    for option in ("--optimizer", "--lr", "--recompute"):
        err = _refused(["infer", "--model", "lenet5", option, "x"], capsys)
        assert f"unrecognized arguments: {option} x (pipecast infer --help)" in err


def _helps(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, argparse.Action, str]]:
    """(verb, option, its help as --help prints it, on one line) for every option with a
    default of its own (not unset, off or empty), of every verb."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                found += _helps(sub, f"{prog} {verb}")
        elif action.option_strings and action.default not in (None, False, [], ()):
            if action.default is argparse.SUPPRESS:
                continue
            text = parser._get_formatter()._expand_help(action)  # what --help prints
            found.append((prog, action, " ".join(text.split())))
    return found


def test_every_default_is_shown_in_help() -> None:
    """train --help and infer --help showed no defaults (--steps 10, --batch 64 ...)."""
    for prog, action, text in _helps(build_parser(), "pipecast"):
        assert "default" in text, f"{prog} {action.option_strings[0]}: {text}"


@pytest.mark.parametrize(
    ("verb", "shown"),
    [
        ("train", ["--steps STEPS timed steps (default: 10)",
                   "--batch BATCH global batch per step (default: 64)",
                   "split this many ways (default: 1 where each replica is one stage, else 8)",
                   "--gpus GPUS processes: GPUs, or CPU ranks (default: 2)",
                   "(required, unless --recommendation)"]),
        ("infer", ["--batch BATCH global batch per step (default: 64; --mode latency: 1)",
                   "(default: 8; --mode latency: 1)", "(required, unless --recommendation)"]),
        ("profile", ["nn.Module (required)", "--repeats REPEATS timed repeats per measurement "
                     "(default: 7)"]),
    ],
)  # fmt: skip
def test_help_shows_defaults_and_what_is_required(
    verb: str, shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in shown:
        assert words in text
