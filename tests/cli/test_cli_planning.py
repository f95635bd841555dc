from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipecast.cli.main import main


@pytest.fixture(scope="module")
def lenet_profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prof") / "lenet.json"
    code = main(
        [
            "profile",
            "--model",
            "lenet5",
            "--micro-batch-sizes",
            "4,8",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "-o",
            str(path),
        ]
    )
    assert code == 0
    return str(path)


def test_partition_compare(lenet_profile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["partition", "--profile", lenet_profile, "--stages", "3", "--compare"]) == 0
    out = capsys.readouterr().out
    for method in ("blocks", "params", "forward", "memory", "compute", "balanced"):
        assert method in out


def test_partition_writes_json(lenet_profile: str, tmp_path: Path) -> None:
    out = tmp_path / "part.json"
    assert main(["partition", "--profile", lenet_profile, "--stages", "2", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["kind"] == "partition"


def test_simulate_writes_gantt_and_trace(
    lenet_profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "simulate",
            "--profile",
            lenet_profile,
            "--stages",
            "2",
            "--schedule",
            "zb-h1",
            "--micro-batches",
            "4",
            "--out-dir",
            str(tmp_path),
            "--compare-closed-form",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "bubble" in out and "closed forms" in out
    # no --cluster: it says which preset priced it, and how to price this machine instead
    assert "cluster: the cpu preset (it counts no host cost per action)" in out
    png = tmp_path / "lenet5-zb-h1-2x4.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((tmp_path / "lenet5-zb-h1-2x4.trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"0F0", "1B3", "1W3"} <= names


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--schedule", "dualpipe"], "unknown schedule 'dualpipe'"),
        (["--schedule", "interleaved", "--micro-batches", "3"], "divisible by ranks"),
        (["--batch", "3", "--micro-batches", "4"], "batch 3 cannot feed 1 replica(s) x 4"),
        (["--batch", "9", "--replicas", "2"], "batch 9 does not split into 2 equal replica"),
        (["--stages", "40"], "only 12 blocks"),
        (["--partition", "0,5,3,12"], "must rise strictly"),
    ],
)
def test_simulate_bad_input(
    lenet_profile: str,
    tmp_path: Path,
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--profile", lenet_profile, "--stages", "2", "--out-dir", str(tmp_path)]
    try:
        code = main(argv + extra)
    except SystemExit as exc:  # argparse's own checks
        code = int(exc.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_planning_verbs_keep_the_memory_margin_in_0_1(
    lenet_profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for verb in ("partition", "simulate"):
        with pytest.raises(SystemExit) as bad:
            main([verb, "--profile", lenet_profile, "--stages", "2", "--memory-margin", "1"])
        assert bad.value.code == 2
        assert "--memory-margin takes a fraction in [0, 1)" in capsys.readouterr().err


def test_missing_profile_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["partition", "--profile", "/nope.json", "--stages", "2"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_profile_pools_host_costs_with_earlier_profiles(
    lenet_profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.values.profile.helpers import scaled

    from pipecast.values.profile.types import Profile

    # an earlier profile whose host readings are 1,000x this machine's and device times
    # 1,000,000x (a CPU profile's host readings are its loop and issue times; blocks carry
    # none): pooled, each reading is at least half the earlier one, far beyond anything a
    # busy machine could add to its own
    taken = Profile.load(lenet_profile)
    assert taken.host.issue > 0
    slow = scaled(taken, 1000.0, issue=taken.host.issue * 1000)
    slow = replace(
        slow,
        blocks=tuple(
            replace(b, costs={mb: replace(c, forward=c.forward * 1e6) for mb, c in b.costs.items()})
            for b in slow.blocks
        ),
    )
    earlier = tmp_path / "earlier.json"
    slow.save(str(earlier))
    out = tmp_path / "pooled.json"
    argv = ["profile", "--model", "lenet5", "--repeats", "2", "--warmup", "1"]
    sizes = ["--micro-batch-sizes", "4,8"]
    assert main([*argv, *sizes, "--pool-host", str(earlier), "-o", str(out)]) == 0
    assert "the mean of 2 profiles" in capsys.readouterr().out
    pooled = Profile.load(str(out))
    assert pooled.host.pooled == 2
    assert pooled.host.issue > 100 * taken.host.issue  # the earlier reading pooled in
    assert pooled.host.reference > 100 * taken.host.reference
    mb = 8
    forward = sum(b.costs[mb].forward for b in pooled.blocks)
    assert forward < 1e4 * sum(b.costs[mb].forward for b in taken.blocks)  # its own device
    # a profile lacking a size is refused before anything is written, with the file named
    out.unlink()
    assert main([*argv, "--micro-batch-sizes", "4", "-o", str(tmp_path / "four.json")]) == 0
    four = str(tmp_path / "four.json")
    assert main([*argv, "--micro-batch-sizes", "4,8", "--pool-host", four, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--pool-host {four} cannot pool" in err and "[8]" in err and not out.exists()
