"""Where a group of ranks sits on a cluster's tiers, and what a collective over it costs.

A cluster is built in three tiers (docs/clusters.md):

    node  g GPUs joined by NVLink (the NVLink domain); intra-node bus bandwidth B_node
    pod   nodes joined rail by rail: NIC k of every node of a pod sits on rail k's leaf
          switch, so GPU k of one node reaches GPU k of any other in one hop; each GPU's
          NICs give it B_rail (NICs per GPU x a NIC's bandwidth)
    pods  joined through spine switches whose uplinks are oversubscribed r : 1, so a GPU's
          traffic leaving its pod gets B_rail / r

Collectives, for S bytes over a group of n = g x k ranks (g on each of k nodes):

    within a node (k = 1), a ring:        2 (g-1)/g x S / B_node
    across nodes, hierarchical (NCCL's tree/ring over rails, Megatron's and torchtitan's
    HSDP meshes alike):
        reduce-scatter in each node        (g-1)/g x S / B_node
        all-reduce across the k nodes,     2 (k-1)/k x (S/g) / B_net     the g rails at once,
        each rail on its 1/g of the data                                 each with 1/g of S
        all-gather in each node            (g-1)/g x S / B_node
      together                             2 (g-1)/g x S / B_node + 2 (k-1)/k x S / (g B_net)
    with B_net = B_rail inside one pod and B_rail / r for a group spanning pods: a ring runs
    at the pace of its slowest link, and the ring across nodes crosses the spine.

An all-gather or a reduce-scatter is one half of that all-reduce (each of its phases moves
(m-1)/m of its data once, not twice); with one GPU per node (g = 1) every formula is the
plain ring across nodes. Latency: 2 (g-1) intra-node plus 2 (k-1) network latencies per
all-reduce, half that per all-gather or reduce-scatter, unless a measured latency is given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """How a group of ranks sits on the tiers."""

    per_node: int
    """g: the most ranks of the group on one node (the nodes' phases run at once, the
    fullest last)."""
    nodes: int
    """k: nodes the group touches."""
    pods: int
    """Pods the group touches."""


def span(ranks: Sequence[int], gpus_per_node: int, nodes_per_pod: int) -> Span:
    """Where `ranks` sit, ranks numbered node by node and nodes pod by pod (nodes_per_pod 0:
    one pod holds every node)."""
    nodes = Counter(r // gpus_per_node for r in ranks)
    pods = {node // nodes_per_pod for node in nodes} if nodes_per_pod else {0}
    return Span(per_node=max(nodes.values(), default=0), nodes=len(nodes), pods=len(pods))


def ring_seconds(nbytes: float, n: int, busbw: float, passes: int = 2) -> float:
    """Bandwidth term of a ring over `n` ranks: passes x (n-1)/n x bytes / bus bandwidth (2
    passes: an all-reduce; 1: an all-gather or a reduce-scatter)."""
    return passes * (n - 1) / n * nbytes / busbw if n > 1 else 0.0


def hierarchical_seconds(
    nbytes: float, where: Span, node_busbw: float, net_bandwidth: float, passes: int = 2
) -> float:
    """Bandwidth term of a hierarchical collective of `nbytes` over a group spanning
    `where.nodes` nodes (the module's formula): the in-node phases at `node_busbw`, the
    cross-node phase on 1/g of the data per rail at `net_bandwidth`."""
    g, k = where.per_node, where.nodes
    inside = ring_seconds(nbytes, g, node_busbw, passes) if g > 1 else 0.0
    return inside + ring_seconds(nbytes / g, k, net_bandwidth, passes)
