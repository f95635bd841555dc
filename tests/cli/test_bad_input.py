"""Bad input to every verb, by class: each gives exit 2 and one line that names the problem,
before any work starts, and writes nothing.

The work a verb would do (profiling, probing, the quick profile, launching ranks, a
recommendation, a suite) is replaced by a stand-in that raises WorkStarted, a BaseException
the CLI does not catch: a check that came after the work began fails here with it, whatever
the machine's speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli.stand_ins import stand_in_work

from pipecast.cli.main import main

SHIPPED = (
    Path(__file__).parents[2] / "src/pipecast/values/profile/shipped/h100/resnet50-imagenet.json"
)
BROKEN = "tests.cli.broken_models"


@pytest.fixture(autouse=True)
def no_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stand_in_work(monkeypatch, tmp_path)


def files(tmp_path: Path) -> dict[Path, bytes]:
    """Every file under `tmp_path` with its bytes."""
    return {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}


def write_inputs(tmp_path: Path) -> None:
    """The files the cases read: of the wrong kind, malformed, binary, empty."""
    (tmp_path / "file.txt").write_text("a plain file where a directory is wanted\n")
    (tmp_path / "list.json").write_text("[1, 2, 3]\n")
    (tmp_path / "truncated.json").write_text('{"kind": "profile", "version": 3, "model": "le')
    (tmp_path / "trailing.json").write_text('{"kind": "profile"} {"kind": "profile"}')
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "rec.json").write_text(json.dumps({"ranked": [], "batch": 8}))
    (tmp_path / "damaged-rec.json").write_text(
        json.dumps({"ranked": [{"strategy": 3, "partition": [0, 4]}], "batch": 8})
    )
    (tmp_path / "cluster.json").write_text(json.dumps({"kind": "cluster", "version": 1}))
    (tmp_path / "notes.sqlite").write_text("these are my notes, not a database\n")
    (tmp_path / "image.sqlite").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))


def check_refused(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    write_inputs(tmp_path)
    before = files(tmp_path)
    paths = sorted(tmp_path.rglob("*"))  # with any folders a case made for itself
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as exc:  # argparse's own checks
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    said = out + err
    assert code == 2, said
    assert message.replace("{tmp}", str(tmp_path)) in err, err
    assert "Traceback" not in said and said.strip().count("\n") == 0, said
    assert files(tmp_path) == before, "something was written"
    assert sorted(tmp_path.rglob("*")) == paths, "something was made"
    return err


PROFILE = ["--profile", str(SHIPPED)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["recommend", "-o", "{tmp}/file.txt/rec.json"], "{tmp}/file.txt is a file, not a dir"),
        (["recommend", "--output", "{tmp}"], "is a directory: name a file to write"),
        (["recommend", "-o", "/proc/pipecast/rec.json"], "no file can be created in /proc"),
        (["profile", "--model", "lenet5", "-o", "{tmp}/file.txt/p.json"], "is a file, not a"),
        (["profile", "--model", "lenet5", "-o", "/proc/p.json"], "cannot write /proc/p.json"),
        (["train", "--model", "lenet5", "--out-dir", "{tmp}/file.txt"], "is a file: name a dir"),
        (["infer", "--model", "lenet5", "--out-dir", "/proc/traces"], "cannot write /proc/"),
        (
            ["train", "--model", "lenet5", "--checkpoint-dir", "{tmp}/file.txt/ck"],
            "cannot create {tmp}/file.txt/ck",
        ),
        (["simulate", *PROFILE, "--stages", "2", "--out-dir", "{tmp}/file.txt"], "is a file"),
        (
            ["partition", *PROFILE, "--stages", "2", "--export", "torch", "--out-dir", "/proc/x"],
            "--out-dir: cannot write /proc/x",
        ),
        (["partition", *PROFILE, "--stages", "2", "-o", "{tmp}"], "is a directory"),
        (["probe", "--describe", "-o", "{tmp}/file.txt/c.json"], "is a file, not a directory"),
        (["probe", "--raw", "{tmp}"], "is a directory: name a file to write"),
        (["bench", "--store", "{tmp}/file.txt/bench.sqlite"], "is a file, not a directory"),
        (["bench", "--store", "{tmp}"], "is a directory: name a file to write"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_work(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(argv, message, tmp_path, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--recommendation", "{tmp}/list.json"], "list.json holds a JSON list, not a"),
        (["infer", "--recommendation", "{tmp}/list.json"], "holds a JSON list, not a recomm"),
        (["train", "--recommendation", "{tmp}/empty.json"], "empty.json is empty"),
        (["train", "--recommendation", "{tmp}/binary.json"], "binary.json holds binary data"),
        (["train", "--recommendation", "{tmp}/damaged-rec.json"], "is a damaged recommendation"),
        (["simulate", "--profile", "{tmp}/binary.json", "--stages", "2"], "holds binary data"),
        (
            ["simulate", "--profile", "{tmp}/truncated.json", "--stages", "2"],
            "truncated.json is not valid JSON: Unterminated string starting at line 1, column",
        ),
        (
            ["partition", "--profile", "{tmp}/trailing.json", "--stages", "2"],
            "trailing.json is not valid JSON: Extra data at line 1, column 21",
        ),
        (["partition", "--profile", "{tmp}/empty.json", "--stages", "2"], "is empty"),
        (["recommend", "--profile", "{tmp}/truncated.json"], "truncated.json is not valid JSON"),
        (["simulate", *PROFILE, "--stages", "2", "--cluster", "{tmp}/truncated.json"], "not valid"),
        (["profile", "--model", "lenet5", "--pool-host", "{tmp}/binary.json"], "binary data"),
        (["bench", "--store", "{tmp}/notes.sqlite"], "notes.sqlite is not a results store: it"),
        (["bench", "--store", "{tmp}/image.sqlite"], "holds binary data, not a SQLite database"),
    ],
)
def test_a_malformed_file_is_named_with_what_it_holds(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = check_refused(argv, message, tmp_path, capsys)
    assert " at at " not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--recommendation", str(SHIPPED)], "holds a 'profile' document, not a rec"),
        (["infer", "--recommendation", "{tmp}/cluster.json"], "holds a 'cluster' document, not"),
        (["simulate", "--profile", "{tmp}/rec.json", "--stages", "2"], "without a 'kind', not"),
        (["partition", "--profile", "{tmp}/cluster.json", "--stages", "2"], "'cluster' document"),
        (["recommend", "--profile", "{tmp}/list.json"], "holds a JSON list, not a 'profile'"),
        (
            ["simulate", *PROFILE, "--stages", "2", "--cluster", str(SHIPPED)],
            "holds a 'profile' document, not a cluster",
        ),
        (["simulate", *PROFILE, "--stages", "2", "--cluster", "{tmp}/list.json"], "a JSON list"),
    ],
)
def test_a_file_of_another_kind_names_what_it_is_and_what_was_wanted(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(argv, message, tmp_path, capsys)


LENET = ["--model", "lenet5"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["models", "--model", "gpt", "--layers", "-1"], "--layers takes a count of at least 0"),
        (["models", "--model", "gpt", "--heads", "-2"], "--heads takes a count of at least 0"),
        (["models", "--model", "gpt", "--width", "0"], "--width takes a count of at least 1"),
        (["models", "--model", "gpt", "--seq-len", "0"], "--seq-len takes a count"),
        (["models", "--model", "gpt", "--vocab", "-8"], "--vocab takes a count of at least 1"),
        (["models", "--model", "transformer", "--ffn", "-1"], "--ffn takes a count"),
        (["profile", *LENET, "--warmup", "-1"], "--warmup takes a count of at least 0"),
        (["profile", *LENET, "--host-windows", "0"], "--host-windows takes a count"),
        (["profile", *LENET, "--repeats", "0"], "--repeats takes a count of at least 1"),
        (["profile", *LENET, "--micro-batch-sizes", "4,0"], "integers of at least 1"),
        (["probe", "--max-bytes", "10"], "--max-bytes takes a count of at least 4096"),
        (["probe", "--describe", "--nodes", "0"], "--nodes takes a count of at least 1"),
        (["probe", "--describe", "--gpus-per-node", "-4"], "--gpus-per-node takes a count"),
        (["probe", "--describe", "--memory=-80GiB"], "is not a size"),
        (["partition", *PROFILE, "--stages", "2", "--micro-batch", "0"], "--micro-batch takes"),
        (["simulate", *PROFILE, "--stages", "2", "--replicas", "0"], "--replicas takes a count"),
        (["simulate", *PROFILE, "--stages", "2", "--batch", "-3"], "--batch takes a count"),
        (["train", *LENET, "--replicas", "0"], "--replicas takes a count of at least 1"),
        (["train", *LENET, "--gpus", "0"], "--gpus takes a count of at least 1"),
        (["train", *LENET, "--warmup-steps", "-1"], "--warmup-steps takes a count"),
        (["train", *LENET, "--lr", "-0.1"], "--lr takes a number of at least 0, got '-0.1'"),
        (["train", *LENET, "--lr", "nan"], "--lr takes a number of at least 0, got 'nan'"),
        (["train", *LENET, "--lr-warmup", "-1"], "--lr-warmup takes a count"),
        (["train", *LENET, "--lr-min", "-0.001"], "--lr-min takes a number of at least 0"),
        (["train", *LENET, "--loss-scale", "-1"], "--loss-scale takes a number of at least 0"),
        (["train", *LENET, "--clip-grad-norm", "inf"], "--clip-grad-norm takes a number"),
        (["train", *LENET, "--timeout", "0"], "--timeout takes a number above 0, got '0'"),
        (["train", *LENET, "--checkpoint-every", "-2"], "--checkpoint-every takes a count"),
        (["train", *LENET, "--keep", "0"], "--keep takes a count of at least 1"),
        (["train", "--recommendation", "{tmp}/rec.json", "--pick", "-1"], "--pick takes a count"),
        (["train", *LENET, "--batch", "4"], "batch 4 cannot feed 1 replica(s) x 8 micro-batches"),
        (["train", *LENET, "--gpus", "3", "--replicas", "2"], "do not split into 2 replica(s)"),
        (["train", *LENET, "--gpus", "65"], "65 CPU ranks is more than pipecast starts"),
        (["train", *LENET, "--device", "cuda"], "2 GPUs requested but this machine has 0"),
        (["infer", *LENET, "--timeout", "-1"], "--timeout takes a number above 0"),
        (["infer", *LENET, "--micro-batches", "0"], "--micro-batches takes a count"),
        (["recommend", *LENET, "--memory-limit", "0"], "--memory-limit takes GiB above 0"),
        (["recommend", *LENET, "--memory-limit", "nan"], "--memory-limit takes GiB above 0"),
        (["recommend", *LENET, "--top", "0"], "--top takes a count of at least 1"),
        (["recommend", *LENET, "--rounds", "0"], "--rounds takes a count of at least 1"),
        (["recommend", *LENET, "--epoch-samples", "0"], "--epoch-samples takes a count"),
        (["recommend", *LENET, "--validate", "-1"], "--validate takes a count of at least 0"),
        (["recommend", *LENET, "--memory-margin", "1.5"], "--memory-margin takes a fraction"),
        (["bench", "--timeout", "-1"], "--timeout takes a number above 0, got '-1'"),
        (["bench", "--timeout", "inf"], "--timeout takes a number above 0, got 'inf'"),
        (["bench", "--rounds", "0"], "--rounds takes a count of at least 1"),
    ],
)
def test_a_number_out_of_range_is_refused_before_work(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(argv, message, tmp_path, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["models", "--model", "lenet6"], "unknown model 'lenet6': choose one of"),
        (["profile", "--model", "lenet5", "--dataset", "svhn"], "unknown dataset 'svhn'"),
        (["train", *LENET, "--schedule", "dualpipe"], "unknown schedule 'dualpipe'"),
        (["train", *LENET, "--partition", "fastest"], "partition 'fastest' is neither a method"),
        (["partition", *PROFILE, "--stages", "2", "--method", "greedy"], "unknown partition me"),
        (["simulate", *PROFILE, "--stages", "2", "--cluster", "h300"], "neither a file nor a pre"),
        (["bench", "--suite", "everything"], "unknown suite 'everything'"),
        (["recommend", *LENET, "--methods", "balanced,best"], "unknown partition method 'best'"),
        (["probe", "--describe", "--intra-bw", "fast"], "'fast' is not a bandwidth"),
        (
            ["partition", *PROFILE, "--stages", "2", "--export", "torch", "--schedule", "nope"],
            "unknown schedule 'nope'",
        ),
    ],
)
def test_an_unknown_name_lists_the_known_ones(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(argv, message, tmp_path, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["models", "--model", f"{BROKEN}:raises"],
            f"the model factory {BROKEN}:raises raised RuntimeError: no weights for mnist",
        ),
        (["profile", "--model", f"{BROKEN}:raises", "-o", "{tmp}/p.json"], "raised RuntimeError"),
        (["train", "--model", f"{BROKEN}:raises_without_spec"], "raised KeyError: 'layer4'"),
        (["infer", "--model", f"{BROKEN}:raises"], f"factory {BROKEN}:raises raised"),
        (
            ["models", "--model", "tests.cli.broken_import:model"],
            "importing 'tests.cli.broken_import' for --model tests.cli.broken_import:model "
            "raised ValueError: this module cannot be imported",
        ),
    ],
)
def test_a_model_factory_that_raises_is_named_with_its_exception(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(argv, message, tmp_path, capsys)


@pytest.mark.parametrize("schedule", ["forward-only", "pipedream"])
def test_an_export_torch_cannot_run_the_same_way_is_refused(
    schedule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["partition", *PROFILE, "--stages", "2", "--schedule", schedule]
    check_refused([*argv, "--export", "torch", "--out-dir", "{tmp}/out"], "--export torch: ",
                  tmp_path, capsys)  # fmt: skip


def _recommendation(tmp_path: Path) -> str:
    """A recommendation for LeNet over 2 CPU ranks, as `pipecast recommend -o` writes one."""
    from pipecast.values.models import Workload
    from pipecast.values.strategy import Strategy

    entry = {
        "strategy": Strategy(kind="pipeline", stages=2, microbatches=4).to_dict(),
        "partition": [0, 6, 12],
        "label": "1f1b 2 stages, M=4",
        "step_time": 0.01,
    }
    doc = {"batch": 8, "device": "cpu", "ranked": [entry],
           "workload": Workload(model="lenet5", dataset="mnist").to_dict()}  # fmt: skip
    path = tmp_path / "lenet-rec.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["train", *LENET, "--batch", "4"], "give --batch 8 or more, or fewer --micro-batches"),
        (
            ["train", *LENET, "--gpus", "2", "--partition", "0,4,8,12"],
            "3 stages do not share out evenly over 2 pipeline ranks: give boundaries for 2 "
            "stages (a multiple of 2 for interleaved and zb-v), or as many ranks (GPUs) as "
            "stages",
        ),
        (
            [
                "train",
                *LENET,
                "--schedule",
                "pipedream",
                "--clip-grad-norm",
                "1",
                "--partition",
                "0,6,12",
            ],
            "(leave clipping off, or use a schedule that updates once a step, such as 1f1b)",
        ),
        (
            ["train", "--recommendation", "{rec}", "--model", "vgg11"],
            "is for lenet5, not vgg11: leave --model out to run it, or `pipecast recommend "
            "--model vgg11`",
        ),
        (
            ["simulate", *PROFILE, "--cluster", "h100-nvlink", "--stages", "16"],
            "needs 16 GPUs, the cluster has 8: use fewer stages or replicas, or a cluster with "
            "more GPUs",
        ),
    ],
)
def test_an_error_says_how_to_fix_it(
    argv: list[str], fix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 55: these said what was wrong and stopped short of what to do."""
    rec = _recommendation(tmp_path)
    check_refused([a.replace("{rec}", rec) for a in argv], fix, tmp_path, capsys)
