"""How the CLI writes durations and sizes."""

import pytest

from pipecast.cli.console import human_bytes, human_seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (2.5e-6, "2.5 µs"),
        (0.01234, "12.34 ms"),
        (1.5, "1.500 s"),
        (59.9, "59.900 s"),
        (60.0, "1 min 00 s"),
        (1039.807, "17 min 20 s"),
        (3599.6, "1 h 00 min"),
        (3600.0, "1 h 00 min"),
        (5 * 3600 + 7 * 60 + 29, "5 h 07 min"),
    ],
)
def test_human_seconds(seconds: float, text: str) -> None:
    assert human_seconds(seconds) == text


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(229.14 * 2**20) == "229.14 MiB"
    assert human_bytes(80 * 2**30) == "80.00 GiB"
