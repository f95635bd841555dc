"""`pipecast train` refuses, before anything starts, a plan predicted not to fit in what the
GPUs have free (its own quick profile's prediction, or the recommendation's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipecast.cli import train_verb
from pipecast.cli.main import main
from pipecast.errors import ConfigError
from pipecast.runtime import devices

GIB = 2**30


def _recommendation(path: Path, peak: int) -> str:
    strategy = {"kind": "pipeline", "stages": 2, "replicas": 1, "schedule": "1f1b",
                "microbatches": 2}  # fmt: skip
    entry = {"strategy": strategy, "partition": [0, 6, 12], "label": "1f1b 2 stages",
             "step_time": 0.01, "peak_memory": peak}  # fmt: skip
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
