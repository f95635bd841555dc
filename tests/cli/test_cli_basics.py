from __future__ import annotations

from pathlib import Path

import pytest

from pipecast.cli.main import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([], capsys)
    assert code == 0 and "models" in out and "data" in out


def test_models_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["models", "--model", "lenet5", "--dataset", "mnist"], capsys)
    assert code == 0 and "61,706" in out and "Conv2d" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["models", "--model", "nope"], "unknown model 'nope': choose one of"),
        (["models", "--model", "lenet5", "--dataset", "svhn"], "unknown dataset 'svhn'"),
        (["models", "--model", "gpt", "--dataset", "mnist"], "takes tokens inputs"),
        (["models", "--model", "tests.user_models:not_a_model"], "must be an nn.Sequential"),
        (["data", "--dataset", "mnist"], "needs --data-dir"),
        (["data", "--dataset", "mnist", "--data-dir", "/nonexistent"], "not found"),
        (
            ["train", "--model", "lenet5", "--partition", "0,6,12", "--cuda-graphs"],
            "CUDA graphs need --device cuda",
        ),
        (
            ["recommend", "--device", "cpu", "--cuda-graphs", "--validate", "1"],
            "which need GPUs",
        ),
        (
            ["recommend", "--recalibrate", "--profile", "p.json"],
            "--recalibrate measures a new profile and --profile gives one",
        ),
        (
            ["recommend", "--model", "lenet5", "--dataset", "mnist", "--cluster", "h100-nvlink"],
            "whose times do not carry to them",
        ),
        (
            ["recommend", "--model", "vgg16", "--cluster", "h200-nvlink", "--validate", "2"],
            "--validate measures strategies here (cpu), but they are predicted for NVIDIA H200",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_malformed_data_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"junk")
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"junk")
    code, _, err = run(["data", "--dataset", "mnist", "--data-dir", str(tmp_path)], capsys)
    assert code == 2 and "not an IDX file" in err


def test_digits_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["data", "--dataset", "digits"], capsys)
    assert code == 0 and "1797 samples" in out
