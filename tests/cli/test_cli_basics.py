from __future__ import annotations

from pathlib import Path

import pytest

from pipecast.cli.main import main
from pipecast.values.hardware.cluster import Cluster


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own checks
        code = int(exc.code or 0)
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


SHIPPED = (
    Path(__file__).parents[2] / "src/pipecast/values/profile/shipped/h100/resnet50-imagenet.json"
)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["partition", "--profile", str(SHIPPED), "--stages", "0"], "--stages takes a count"),
        (
            ["simulate", "--profile", str(SHIPPED), "--stages", "2", "--micro-batches", "0"],
            "at least 1",
        ),
        (
            ["recommend", "--model", "lenet5", "--batch", "-5"],
            "--batch takes a count of at least 1",
        ),
        (["recommend", "--model", "lenet5", "--device", "cpu", "--gpus", "100000"], "CPU ranks"),
        (["train", "--model", "lenet5", "--steps", "0"], "--steps takes a count"),
        (["probe", "--devices", "0"], "--devices takes a count"),
        (["profile", "--model", "lenet5", "-o", "{tmp}"], "is a directory: name a file"),
        (["report", "--store", "{tmp}"], "is a directory, expected a results store"),
        (["partition", "--profile", "{tmp}/none.json", "--stages", "2"], "file not found"),
        (["partition", "--profile", "{tmp}", "--stages", "2"], "is a directory, expected a file"),
        (
            ["train", "--recommendation", str(SHIPPED)],
            "holds a 'profile' document, not a recommendation",
        ),
        (["simulate", "--profile", "{tmp}/rec.json", "--stages", "2"], "not a 'profile'"),
        (
            ["recommend", "--model", "resnet18", "--dataset", "cifar10", "--profile", str(SHIPPED)],
            "the profile is of resnet50-imagenet, not resnet18-cifar10",
        ),
        (
            ["train", "--model", "lenet5", "--gpus", "2", "--micro-batches", "8", "--batch", "4"],
            "at least 8",
        ),
    ],
)
def test_every_verbs_bad_numbers_and_paths_stop_before_anything_runs(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0, negative, huge, a missing file, a directory, a file of the wrong kind, a profile of
    another model: one line, exit 2, and nothing written."""
    (tmp_path / "rec.json").write_text('{"ranked": [], "batch": 8}')
    before = sorted(tmp_path.iterdir())
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as exc:  # argparse's own checks
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "Traceback" not in err and err.strip().count("\n") == 0
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("preset", "want"),
    [
        ({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, {}),
    ],
)
def test_a_verb_runs_with_expandable_segments_unless_the_user_set_the_allocator(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    preset: dict[str, str],
    want: dict[str, str],
) -> None:
    """The CLI sets the allocator's variable before its verb runs (before anything starts
    CUDA in its own process), and leaves a user's own setting, under either name, as it is."""
    import os

    from pipecast.runtime.env_defaults import ALLOCATOR_ENV

    for key in ALLOCATOR_ENV:
        monkeypatch.setenv(key, "")  # so that monkeypatch restores it as it was
        monkeypatch.delenv(key)
    for key, value in preset.items():
        monkeypatch.setenv(key, value)
    code, _, _ = run(["models", "--model", "lenet5", "--dataset", "mnist"], capsys)
    assert code == 0
    assert {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ} == {**preset, **want}


def test_a_described_machine_by_default_links_nodes_no_faster_than_gpus_in_a_node(
    tmp_path: Path,
) -> None:
    """`probe --describe`'s defaults once made the link between nodes (5 us) faster than
    the one inside a node (10 us). Read back from what the command writes."""
    out = tmp_path / "c.json"
    assert main(["probe", "--describe", "--nodes", "2", "-o", str(out)]) == 0
    c = Cluster.load(str(out))
    inside, across = c.link(0, 1), c.link(0, c.gpus_per_node)
    assert (inside, across) == (c.intra, c.inter)
    assert inside.latency < across.latency and inside.bandwidth > across.bandwidth
