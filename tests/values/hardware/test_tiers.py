"""Collectives and transfers priced by tier: NVLink within a node, the rails across the nodes
of a pod, the oversubscribed spine across pods (values/hardware/tiers.py).

Each expected time is the closed form worked by hand for the group: a ring all-reduce of S
bytes over n ranks moves 2(n-1)/n x S; a hierarchical one reduce-scatters in each node,
all-reduces 1/g of S over the nodes on each of the g rails, and all-gathers in each node.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipecast.errors import ConfigError, DataError
from pipecast.values.hardware.cluster import Cluster, Link, cluster_from_dict

S = 1e9
"""Bytes all-reduced."""
NVLINK = 400e9
RAIL = 50e9


def _cluster(nodes_per_pod: int = 0, oversubscription: float = 1.0) -> Cluster:
    """8 nodes of 8 GPUs, NVLink at 400 GB/s and a 50 GB/s rail per GPU, no latency."""
    return Cluster(
        gpus_per_node=8,
        nodes=8,
        memory_bytes=2**30,
        intra=Link(latency=0.0, bandwidth=NVLINK),
        inter=Link(latency=0.0, bandwidth=RAIL),
        nodes_per_pod=nodes_per_pod,
        oversubscription=oversubscription,
    )


def test_a_group_within_a_node_rings_over_nvlink() -> None:
    # 8 GPUs of node 1: 2 x 7/8 x 1 GB / 400 GB/s
    assert _cluster().allreduce_time(S, range(8, 16)) == pytest.approx(2 * 7 / 8 * S / NVLINK)


def test_one_gpu_per_node_rings_over_the_rails() -> None:
    # GPU 0 of 4 nodes, one rail: 2 x 3/4 x 1 GB / 50 GB/s
    assert _cluster().allreduce_time(S, [0, 8, 16, 24]) == pytest.approx(2 * 3 / 4 * S / RAIL)


def test_whole_nodes_reduce_in_the_node_and_across_on_every_rail() -> None:
    # 2 nodes of 8: in-node 2 x 7/8 x S / 400 GB/s (reduce-scatter + all-gather), across the
    # nodes 2 x 1/2 x (S/8) / 50 GB/s on each of the 8 rails at once
    expected = 2 * 7 / 8 * S / NVLINK + 2 * 1 / 2 * (S / 8) / RAIL
    assert _cluster().allreduce_time(S, range(16)) == pytest.approx(expected)
    # 4 nodes, 2 GPUs of each: 2 x 1/2 x S / 400 GB/s + 2 x 3/4 x (S/2) / 50 GB/s
    group = [r for node in range(4) for r in (8 * node, 8 * node + 1)]
    expected = 2 * 1 / 2 * S / NVLINK + 2 * 3 / 4 * (S / 2) / RAIL
    assert _cluster().allreduce_time(S, group) == pytest.approx(expected)


def test_a_group_across_pods_divides_the_rails_by_the_oversubscription() -> None:
    """Pods of 2 nodes under a 2:1 spine: the cross-node part of a group spanning pods takes
    twice as long, its in-node part no longer; a group inside one pod is untouched."""
    flat, spine = _cluster(nodes_per_pod=2), _cluster(nodes_per_pod=2, oversubscription=2)
    across = 2 * 3 / 4 * (S / 8) / RAIL  # 4 nodes of 8, on each rail
    inside = 2 * 7 / 8 * S / NVLINK
    assert flat.allreduce_time(S, range(32)) == pytest.approx(inside + across)
    assert spine.allreduce_time(S, range(32)) == pytest.approx(inside + 2 * across)
    # one GPU on each of nodes 0 and 2 (pods 0 and 1): 2 x 1/2 x S / (50 / 2) GB/s
    assert spine.allreduce_time(S, [0, 16]) == pytest.approx(S / (RAIL / 2))
    # nodes 0 and 1, one pod: the spine is not crossed
    assert spine.allreduce_time(S, range(16)) == pytest.approx(flat.allreduce_time(S, range(16)))


def test_sharded_collectives_across_nodes_take_half_the_all_reduce() -> None:
    """An all-gather or reduce-scatter across nodes runs each phase's data once."""
    c = _cluster(nodes_per_pod=2, oversubscription=2)
    half = (2 * 7 / 8 * S / NVLINK + 2 * 3 / 4 * (S / 8) / (RAIL / 2)) / 2
    assert c.allgather_time(S, range(32)) == pytest.approx(half)
    assert c.reduce_scatter_time(S, range(32)) == pytest.approx(half)


def test_latency_counts_the_hops_of_each_tier() -> None:
    """2(g-1) NVLink latencies and 2(k-1) network latencies: 2 nodes of 8, 10 us and 5 us."""
    c = replace(
        _cluster(),
        intra=Link(latency=10e-6, bandwidth=NVLINK),
        inter=Link(latency=5e-6, bandwidth=RAIL),
    )
    expected = 2 * 7 * 10e-6 + 2 * 1 * 5e-6 + 2 * 7 / 8 * S / NVLINK + (S / 8) / RAIL
    assert c.allreduce_time(S, range(16)) == pytest.approx(expected)


def test_a_transfer_takes_the_link_between_the_two_places() -> None:
    c = _cluster(nodes_per_pod=2, oversubscription=4)
    assert c.link(0, 7).bandwidth == NVLINK  # one node
    assert c.link(0, 15).bandwidth == RAIL  # nodes 0 and 1, one pod
    assert c.link(0, 16).bandwidth == RAIL / 4  # pods 0 and 1 through a 4:1 spine
    assert c.link(16, 0).bandwidth == RAIL / 4


def test_the_fabric_round_trips_and_old_files_keep_one_pod() -> None:
    c = _cluster(nodes_per_pod=2, oversubscription=2)
    assert Cluster.from_json(c.to_json()) == c
    old = json.loads(_cluster().to_json())
    for key in ("nics_per_gpu", "nodes_per_pod", "oversubscription"):
        del old[key]
    back = Cluster.from_json(json.dumps(old))
    assert (back.nics_per_gpu, back.nodes_per_pod, back.oversubscription) == (1, 0, 1.0)


def test_a_description_gives_the_network_as_nics() -> None:
    doc = {
        "gpus_per_node": 8,
        "memory": "80GiB",
        "intra": {"bandwidth": "450GB/s"},
        "nic": {"bandwidth": "400Gbit/s", "latency": "5us"},
        "nics_per_gpu": 2,
    }
    c = cluster_from_dict(doc)
    assert c.inter.bandwidth == 2 * 50e9 and c.nic_bandwidth == 50e9
    assert c.inter.latency == pytest.approx(5e-6)
    with pytest.raises(DataError, match="both 'nic' and 'inter'"):
        cluster_from_dict({**doc, "inter": {"bandwidth": "50GB/s"}})
    with pytest.raises(ConfigError, match="oversubscription >= 1"):
        cluster_from_dict({**doc, "oversubscription": 0.5})
