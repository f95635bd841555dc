"""The bad inputs of issue 66, each refused with one line and exit 2 before any work starts,
writing nothing (test_bad_input's stand-ins replace the work: a check that came after the
work began fails here with WorkStarted).

Each case was once accepted (exit 0, the input ignored) or found only after minutes of work,
or in several lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.cli.stand_ins import WorkStarted
from tests.cli.test_bad_input import LENET, PROFILE, SHIPPED, check_refused, no_work

from pipecast.cli.main import main
from pipecast.orchestration.recommend.session import Request
from pipecast.values.models import Workload
from pipecast.values.strategy import Strategy

__all__ = ["no_work"]  # the stand-ins for the work, autouse here too

POOL_HOST = ["--pool-host", str(SHIPPED)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["recommend", "--dataset", "nosuch"], "argument --dataset: unknown dataset 'nosuch'"),
        (["recommend", *LENET, "--dataset", "nosuch"], "unknown dataset 'nosuch': choose one"),
        (
            ["recommend", "--dataset", "mnist"],
            "--dataset mnist describes the model, and no --model is given: recommend plans",
        ),
        (["recommend", *PROFILE, "--layers", "4"], "--layers 4 describes the model, and no"),
        (["models", "--dataset", "cifar10"], "no --model is given: models lists the zoo"),
        (
            ["infer", *LENET, "--mode", "latency", "--batch", "16"],
            "--mode latency runs one request (batch 1 in one micro-batch), and --batch 16 asks",
        ),
        (["infer", *LENET, "--mode", "latency", "--micro-batches", "2"], "--micro-batches 2 asks"),
        (
            ["infer", *LENET, "--compare", "onnxruntime", "--compare", "onnxruntime"],
            "--compare onnxruntime is given 2 times: name each runtime once",
        ),
        (
            ["train", *LENET, "--pick", "3"],
            "--pick 3 picks from --recommendation's ranking, and no --recommendation is given",
        ),
        (["recommend", "--memory-limit", "1e30"], "--memory-limit takes GiB per GPU (or CPU"),
        (["recommend", "--memory-limit", "16385"], "at most 16384 (16 TiB, beyond any one"),
        (
            ["partition", *PROFILE, "--stages", "2", "--schedule", "nosuch"],
            "argument --schedule: unknown schedule 'nosuch': choose one of",
        ),
        (["simulate", *PROFILE, "--stages", "2", "--schedule", "nosuch"], "unknown schedule"),
        (["train", *LENET, "--schedule", "nosuch"], "argument --schedule: unknown schedule"),
        (
            ["train", *LENET, "--schedule", "forward-only"],
            "--schedule forward-only, which trains nothing (forwards only): `pipecast infer`",
        ),
        (
            [
                "train",
                *LENET,
                "--schedule",
                "zb-h1",
                "--batch",
                "16",
                "--micro-batches",
                "4",
                "--weight-batch",
                "100",
            ],
            "a weight batch of 100 is more than the 4 micro-batches zb-h1 runs a step",
        ),
    ],
)
def test_an_ignored_input_is_refused(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(argv, message, tmp_path, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["train", *LENET, "--data-dir", "{tmp}/empty"],
            "no 'train-images-idx3-ubyte' (or .gz) in {tmp}/empty: point --data-dir at the MNIST",
        ),
        (
            ["train", "--model", "resnet18", "--dataset", "cifar10", "--data-dir", "{tmp}/empty"],
            "no CIFAR-10 batches (data_batch_1, data_batch_2, data_batch_3, data_batch_4, "
            "data_batch_5) in {tmp}/empty: point --data-dir at the CIFAR-10 python batches",
        ),
        (
            ["train", *LENET, "--schedule", "pipedream", "--offload", "weights"],
            "PipeDream's stashed weight versions can't be streamed from the host",
        ),
        (
            ["train", *LENET, "--schedule", "pipedream", "--gpus", "4", "--replicas", "2"],
            "PipeDream's asynchronous updates with data-parallel replicas are not supported",
        ),
        (
            ["profile", *LENET, *POOL_HOST],
            f"--pool-host {SHIPPED} cannot pool with this profile: it profiles resnet50/imagenet,"
            " not lenet5/mnist",
        ),
        (
            ["profile", "--model", "resnet50", "--dataset", "imagenet", *POOL_HOST],
            "cannot pool with this profile: it was measured in bf16, not fp32",
        ),
        (
            [
                "profile",
                "--model",
                "resnet50",
                "--dataset",
                "imagenet",
                "--dtype",
                "bf16",
                *POOL_HOST,
            ],
            "cannot pool with this profile: it was measured on NVIDIA H100 80GB HBM3, not cpu",
        ),
        (["recommend", "--model", "timm:nosuch_vit"], "timm has no model 'nosuch_vit'"),
        (
            ["recommend", "--model", "tests.user_models:not_a_model"],
            "tests.user_models:not_a_model must be an nn.Sequential or a non-empty list of "
            "nn.Modules, got int",
        ),
    ],
)
def test_an_input_found_late_is_found_before_work(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each of these was found by rank 0 after the quick profile, or after the work."""
    (tmp_path / "empty").mkdir()
    check_refused(argv, message, tmp_path, capsys)


@pytest.mark.parametrize(
    "model", ["tests.user_models:tiny_list", "lenet5", "tests.user_models:residual_net"]
)
def test_a_model_that_can_be_made_is_not_refused(model: str, tmp_path: Path) -> None:
    """The checks above stop short of refusing what works: the work starts."""
    with pytest.raises(WorkStarted):
        main(["recommend", "--model", model, "--dataset", "mnist"])


def test_a_model_export_cannot_take_is_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    """torch.export's warning and its partial graphs (22 lines, one written by torch's own
    log handler: hence capfd, which sees what reaches the process's stderr) are kept back."""
    code = main(["models", "--model", "tests.cli.broken_models:dynamic"])
    out, err = capfd.readouterr()
    assert code == 2 and not out, out
    assert err.startswith(
        "pipecast: error: cannot capture tests.cli.broken_models:dynamic (_DataDependent) with "
        "torch.export: GuardOnDataDependentSymNode: "
    ), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("batch", "replicas", "microbatches"), [(15, 1, 2), (6, 1, 4), (3, 1, 4), (9, 2, 2), (8, 2, 3)]
)
def test_simulate_and_train_split_a_batch_by_one_rule(
    batch: int,
    replicas: int,
    microbatches: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """simulate refused batch 6 in 4 micro-batches that train ran (as 2, 2, 1, 1): both now
    take what the runtime can split, an equal share per replica cut by torch.tensor_split
    into non-empty micro-batches, and simulate prices the largest of them."""
    share, rest = divmod(batch, replicas)
    chunks = torch.tensor_split(torch.arange(share), microbatches)
    runs = rest == 0 and all(len(c) for c in chunks)
    counts = ["--batch", str(batch), "--micro-batches", str(microbatches)]
    layout = ["--replicas", str(replicas), "--gpus", str(2 * replicas)]
    try:
        main(["train", *LENET, *counts, *layout])
        trained = 2
    except WorkStarted:
        trained = 0
    simulated = main(["simulate", *PROFILE, "--stages", "2", *counts, "--replicas", str(replicas),
                      "--out-dir", str(tmp_path)])  # fmt: skip
    out, err = capsys.readouterr()
    assert (trained, simulated) == ((0, 0) if runs else (2, 2)), err
    if runs:
        assert f"(micro-batch {max(len(c) for c in chunks)})" in out


@pytest.mark.parametrize(
    ("extra", "counts"),
    [
        ([], (64, 8)),
        (["--mode", "latency"], (1, 1)),
        (["--mode", "latency", "--batch", "1", "--micro-batches", "1"], (1, 1)),
        (["--batch", "16"], (16, 8)),
    ],
)
def test_infer_runs_the_batch_it_is_given(
    extra: list[str], counts: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What infer hands the job: its defaults, one request in latency mode, or --batch."""
    seen: dict[str, object] = {}

    def make_job(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise WorkStarted

    monkeypatch.setattr("pipecast.cli.train_verb.make_job", make_job)
    with pytest.raises(WorkStarted):
        main(["infer", *LENET, *extra])
    assert (seen["batch"], seen["microbatches"]) == counts


def _recommendation(tmp_path: Path, name: str, device: str, stages: int) -> str:
    """A recommendation of LeNet-5 over `stages` ranks of `device`, as `pipecast recommend
    -o` writes one (a machine without GPUs plans for an 8-GPU node by default)."""
    entry = {
        "strategy": Strategy(kind="pipeline", stages=stages, microbatches=8).to_dict(),
        "partition": [*range(stages), 12],
        "label": f"1f1b {stages} stages, M=8",
        "step_time": 0.01,
    }
    doc = {"batch": 64, "device": device, "ranked": [entry],
           "workload": Workload(model="lenet5", dataset="mnist").to_dict()}  # fmt: skip
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            [],
            "{rec} plans 8 GPUs and this machine has 0: run it where there are 8, or plan for "
            "this machine with `pipecast recommend --device cpu` and run that",
        ),
        (
            ["--device", "cpu"],
            "--device cpu: {rec} plans 8 cuda rank(s), its partition and schedule for them: "
            "plan for --device cpu with `pipecast recommend --device cpu` and run that",
        ),
        (["--gpus", "2"], "--gpus 2: {rec} plans 8 cuda rank(s), its partition and schedule"),
    ],
)
def test_a_gpu_recommendation_here_is_refused_with_advice_that_works(
    extra: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a machine without GPUs, the main job's recommendation (8 GPUs) said 'use fewer
    --gpus or --device cpu', and said it again with either added (the recommendation set
    both). The advice now is to plan for this machine, and following it runs."""
    rec = _recommendation(tmp_path, "gpu-rec.json", "cuda", 8)
    check_refused(["train", "--recommendation", rec, *extra], message.format(rec=rec),
                  tmp_path, capsys)  # fmt: skip
    requests = []

    def recommend_for(request: Request, *args: object) -> None:
        requests.append(request)
        raise WorkStarted

    monkeypatch.setattr("pipecast.cli.recommend_verb.recommend_for", recommend_for)
    with pytest.raises(WorkStarted):
        main(["recommend", "--device", "cpu"])
    assert requests[0].device == "cpu"
    with pytest.raises(WorkStarted):  # what that writes: ranks of this machine's CPU
        main(["train", "--recommendation", _recommendation(tmp_path, "cpu.json", "cpu", 2)])


def test_the_advice_for_gpus_this_machine_lacks_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refused(["train", *LENET, "--device", "cuda"],
                  "2 GPUs requested but this machine has 0: use --device cpu (CPU ranks)",
                  tmp_path, capsys)  # fmt: skip
    with pytest.raises(WorkStarted):
        main(["train", *LENET, "--device", "cpu"])
