"""A rank's CPUs: the kernel's CPU lists, hyperthreads kept together, whole cores shared out."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipecast.errors import ConfigError
from pipecast.runtime import cpubind


def test_parse_cpulist() -> None:
    assert cpubind.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpubind.parse_cpulist("5") == {5}
    assert cpubind.parse_cpulist("") == set()


def _fake_sysfs(root: Path, siblings: dict[int, str]) -> str:
    for cpu, text in siblings.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return str(root)


def test_cores_keep_hyperthreads_together(tmp_path: Path) -> None:
    # 4 cores x 2 threads, numbered the way Linux numbers them: sibling of i is i + 4
    root = _fake_sysfs(tmp_path, {i: f"{i % 4},{i % 4 + 4}" for i in range(8)})
    assert cpubind.cores(range(8), root) == [
        frozenset({0, 4}),
        frozenset({1, 5}),
        frozenset({2, 6}),
        frozenset({3, 7}),
    ]
    # a sibling outside the CPUs asked about is left out
    assert cpubind.cores({0, 1, 4}, root) == [frozenset({0, 4}), frozenset({1})]


def test_cores_without_topology_are_single_cpus(tmp_path: Path) -> None:
    assert cpubind.cores({3, 1}, str(tmp_path)) == [frozenset({1}), frozenset({3})]


def test_shares_are_disjoint_whole_cores_covering_the_node(tmp_path: Path) -> None:
    root = _fake_sysfs(tmp_path, {i: f"{i % 4},{i % 4 + 4}" for i in range(8)})
    groups = cpubind.cores(range(8), root)
    assert cpubind.share(groups, 2, 0) == {0, 4, 1, 5}
    assert cpubind.share(groups, 2, 1) == {2, 6, 3, 7}
    three = [cpubind.share(groups, 3, i) for i in range(3)]
    assert [len(s) for s in three] == [4, 2, 2]  # 4 cores over 3 ranks: 2, 1, 1
    assert set().union(*three) == set(range(8))
    assert sum(len(s) for s in three) == 8  # disjoint
    assert cpubind.share(groups, 2, 1, limit=1) == {2, 6}  # the share's first core
    # more ranks than cores: each rank keeps the whole node rather than nothing
    assert cpubind.share(groups, 5, 4) == set(range(8))
    with pytest.raises(ConfigError):
        cpubind.share(groups, 2, 2)


def test_policy_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpubind.ENV, raising=False)
    assert cpubind.policy() == ("node", 0)
    monkeypatch.setenv(cpubind.ENV, "Rank")
    assert cpubind.policy() == ("rank", 0)
    monkeypatch.setenv(cpubind.ENV, "rank:2")
    assert cpubind.policy() == ("rank", 2)
    for bad in ("cores", "node:2", "rank:x"):
        monkeypatch.setenv(cpubind.ENV, bad)
        with pytest.raises(ConfigError, match=f"PIPECAST_CPU_BIND='{bad}'"):
            cpubind.policy()
