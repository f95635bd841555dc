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


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (826.45 * 2**10, "826.45 KiB"),
        (2**20 - 1, "1.00 MiB"),  # not "1024.00 KiB"
        (0.001 * 2**30, "1.02 MiB"),  # a --memory-limit of 0.001 GiB, not "0.00 GiB"
        (2**40, "1.00 TiB"),
    ],
)
def test_human_bytes_picks_the_unit_that_shows_the_digits(n: float, text: str) -> None:
    assert human_bytes(n) == text
