"""`pipecast train` refuses, before anything starts, a plan predicted not to fit in what the
GPUs have free (its own quick profile's prediction, or the recommendation's), or whose
offload needs more of the host's memory than it has free."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipecast.cli import train_verb
from pipecast.cli.main import main
from pipecast.errors import ConfigError
from pipecast.runtime import devices

GIB = 2**30


def _recommendation(path: Path, peak: int, host: int = 0) -> str:
    strategy = {"kind": "pipeline", "stages": 2, "replicas": 1, "schedule": "1f1b",
                "microbatches": 2, "offload": "weights" if host else "none"}  # fmt: skip
    entry = {"strategy": strategy, "partition": [0, 6, 12], "label": "1f1b 2 stages",
             "step_time": 0.01, "peak_memory": peak, "host_memory": host}  # fmt: skip
    doc = {"ranked": [entry], "batch": 8, "device": "cuda", "dtype": "bf16",
           "workload": {"model": "lenet5", "dataset": "mnist"}}  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_plan_predicted_not_to_fit_is_refused_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(train_verb, "_check_ranks", lambda *args: None)  # no GPUs here
    monkeypatch.setattr(devices, "free_on_gpus", lambda: [GIB, GIB // 2])

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(train_verb, "run_job", never)
    rec = _recommendation(tmp_path / "rec.json", peak=3 * GIB // 4)
    out = tmp_path / "out"
    assert main(["train", "--recommendation", rec, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "GPU 1 has 512.00 MiB free" in err, err
    assert not out.exists()


def test_what_fits_or_cannot_be_known_passes() -> None:
    train_verb.check_fits(GIB, [2 * GIB, GIB], 2)  # exactly what GPU 1 has free
    train_verb.check_fits(GIB, None, 2)  # no driver to ask
    train_verb.check_fits(0, [1], 2)  # no prediction
    train_verb.check_fits(GIB, [2 * GIB, 1], 1)  # GPU 1 is not used
    with pytest.raises(ConfigError, match="GPU 0"):
        train_verb.check_fits(GIB + 1, [GIB], 1)


def test_a_plan_whose_host_memory_is_not_free_is_refused_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weights streamed from 3 GiB of host memory, the GPUs roomy, the host with 1 GiB free:
    one line naming both, exit 2, nothing run; with 3 GiB free it would start."""
    monkeypatch.setattr(train_verb, "_check_ranks", lambda *args: None)  # no GPUs here
    monkeypatch.setattr(devices, "free_on_gpus", lambda: [GIB, GIB])
    monkeypatch.setattr(devices, "free_host_memory", lambda: GIB)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(train_verb, "run_job", never)
    rec = _recommendation(tmp_path / "rec.json", peak=GIB // 2, host=3 * GIB)
    out = tmp_path / "out"
    assert main(["train", "--recommendation", rec, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "needs 3.00 GiB of host memory" in err and "the host has 1.00 GiB free" in err, err
    assert not out.exists()
    monkeypatch.setattr(devices, "free_host_memory", lambda: 3 * GIB)
    with pytest.raises(AssertionError, match="the run started"):
        main(["train", "--recommendation", rec, "--out-dir", str(out)])


def test_host_memory_that_fits_or_cannot_be_known_passes() -> None:
    train_verb.check_host_fits(GIB, GIB)  # exactly what is free
    train_verb.check_host_fits(GIB, None)  # the kernel does not say
    train_verb.check_host_fits(0, 1)  # nothing offloaded
    with pytest.raises(ConfigError, match=r"needs 1\.00 GiB of host memory"):
        train_verb.check_host_fits(GIB + 1, GIB)


def test_the_recommendation_file_carries_the_host_memory_to_train() -> None:
    """What recommend writes for a plan (its entry) is what train reads back: the host
    memory of the streamed, recomputed plan of four hand blocks."""
    from tests.planning.recommend.test_offload_recommend import _four_blocks

    from pipecast.orchestration.recommend.session import _entry
    from pipecast.planning.recommend.chosen import chosen
    from pipecast.planning.recommend.rank import recommend
    from pipecast.values.hardware.presets import describe

    profile, need = _four_blocks()
    gpu = describe(gpus_per_node=1, memory=f"{need}B")
    rec = recommend(profile, gpu, 1, memory_margin=0.0)
    offloaded = rec.best
    read = chosen({"ranked": [_entry(offloaded, rec)], "batch": 1})
    assert read.host_memory == offloaded.host_memory > 0


def test_cpu_ranks_that_offload_check_the_host_from_the_quick_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a recommendation the quick profile predicts the host memory: LeNet-5 over 2
    CPU ranks with its weights streamed needs some; a host with 1000 bytes free refuses."""
    monkeypatch.setattr(devices, "free_host_memory", lambda: 1000)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(train_verb, "run_job", never)
    args = ["train", "--model", "lenet5", "--device", "cpu", "--gpus", "2", "--offload",
            "weights", "--steps", "1", "--out-dir", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "of host memory" in err and "the host has 1000 B free" in err, err
