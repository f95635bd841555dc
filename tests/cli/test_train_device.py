"""`pipecast train --device`: the GPUs where torch finds them, as recommend plans for them."""

from __future__ import annotations

import pytest
import torch

from pipecast.cli import train_verb
from pipecast.cli.main import main
from pipecast.errors import ConfigError


@pytest.fixture
def devices_asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The device each train or infer run asks make_job for (the run stops there)."""
    asked: list[str] = []

    def make_job(workload: object, **options: object) -> None:
        asked.append(str(options["device"]))
        raise ConfigError("stopped before the quick profile")

    monkeypatch.setattr(train_verb, "make_job", make_job)
    return asked


@pytest.mark.parametrize(
    ("gpus_here", "argv", "device"),
    [
        (True, [], "cuda"),
        (False, [], "cpu"),
        (True, ["--device", "cpu"], "cpu"),
    ],
)
@pytest.mark.parametrize("verb", ["train", "infer"])
def test_the_device_defaults_to_the_gpus_where_torch_finds_them(
    verb: str,
    gpus_here: bool,
    argv: list[str],
    device: str,
    devices_asked: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus_here)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if gpus_here else 0)
    assert main([verb, "--model", "lenet5", "--partition", "0,6,12", *argv]) == 2
    assert "stopped before the quick profile" in capsys.readouterr().err
    assert devices_asked == [device]
