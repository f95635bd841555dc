"""A model too big for the work asked of it is refused before that work starts, in one line
naming its size, the memory and the fix (cli.model_size): nothing is built whole, on the
meta device or any other."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.cli.stand_ins import stand_in_work

from pipecast.cli.main import main
from pipecast.cli.model_size import MAX_BLOCKS
from pipecast.runtime import devices
from pipecast.values.models.size import EXACT_LAYERS
from pipecast.values.models.workload import Workload

SRC = Path(__file__).parents[2] / "src"
GIB = 2**30


@pytest.fixture(autouse=True)
def no_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The verbs' work stands in for WorkStarted, and a build of more layers than the size
    check builds fails the test: the refusal must come from the configuration alone."""
    verbs = ("pipecast.cli.profile_verb.profile_model", "pipecast.cli.recommend_verb.recommend_for")
    stand_in_work(monkeypatch, tmp_path, verbs)
    build = Workload.build

    def small_only(self: Workload, device: str | torch.device | None = None) -> torch.nn.Sequential:
        assert self.layers <= EXACT_LAYERS, f"built {self.layers} layers"
        return build(self, device)

    monkeypatch.setattr(Workload, "build", small_only)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    said = capsys.readouterr()
    err = said.err.strip()
    assert code == 2, said
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def host_of(monkeypatch: pytest.MonkeyPatch, cpu: int, gpu: int = 0) -> None:
    """This machine has `cpu` bytes of memory, and a GPU of `gpu` where that is not 0."""

    def total(device: torch.device) -> int:
        return gpu if device.type == "cuda" else cpu

    monkeypatch.setattr(devices, "total_memory", total)
    if gpu:
        monkeypatch.setattr("torch.cuda.is_available", lambda: True)
        monkeypatch.setattr("torch.cuda.device_count", lambda: 1)


@pytest.mark.parametrize("verb", ["recommend", "profile"])
def test_a_model_bigger_than_the_host_is_refused_before_profiling(
    verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPT, 1,000,000 layers of width 64: 12 x 64^2 + 13 x 64 parameters a layer (the
    attention's and MLP's weights and biases, two norms), as a whole build of few counts."""
    host_of(monkeypatch, 16 * GIB)
    err = _refused([verb, "--model", "gpt", "--layers", "1000000", "--width", "64"], capsys)
    layer = 12 * 64**2 + 13 * 64
    small = Workload(model="gpt", dataset="tokens", layers=2, width=64)
    params = sum(p.numel() for p in small.build("meta").parameters()) + (10**6 - 2) * layer
    assert f"gpt with 1,000,000 layers ({params:,} parameters)" in err, err
    assert f"takes {4 * params / GIB:.2f} GiB as built (fp32)" in err, err
    assert "this machine's 16.00 GiB of memory" in err and "use fewer --layers" in err, err


def test_a_block_bigger_than_the_gpu_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Width 8192: a block's 12 x 8192^2 weights alone are 3 GiB in fp32, over a 2 GiB GPU
    (and the 8 blocks under the host's 1 TiB)."""
    host_of(monkeypatch, 2**40, gpu=2 * GIB)
    err = _refused(["profile", "--model", "gpt", "--width", "8192", "--device", "cuda"], capsys)
    assert "has a block of 3.00 GiB (fp32), more than the 2.00 GiB of the GPU" in err, err


def test_a_model_of_more_blocks_than_pipecast_builds_is_refused_even_to_list(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host_of(monkeypatch, 2**40)
    err = _refused(["models", "--model", "gpt", "--layers", "1000000"], capsys)
    assert f"has 1,000,002 blocks, more than the {MAX_BLOCKS:,} pipecast builds" in err, err


def test_the_refusal_holds_little_memory() -> None:
    """The issue's case in a process of its own, under a 6 GiB address-space limit that
    stops a regression before it takes the machine: exit 2, one line, and a peak resident
    set under 2 GiB (the imports alone take about half of that)."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 * GIB, 6 * GIB))
        resource.setrlimit(resource.RLIMIT_CPU, (300, 300))

    env = {**os.environ, "PYTHONPATH": str(SRC), "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-m", "pipecast", "recommend", "--model", "gpt", "--layers", "1000000"]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limits
    ) as child:
        _, status, usage = os.wait4(child.pid, 0)
        assert child.stderr is not None
        err = child.stderr.read().decode().strip()
        child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 2, err
    assert len(err.splitlines()) == 1 and "of memory, which holds the whole model" in err, err
    assert usage.ru_maxrss * 1024 < 2 * GIB, usage.ru_maxrss
