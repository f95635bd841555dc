"""Cluster: the GPUs a plan runs on and the links between them (pure data)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipecast import jsonio
from pipecast.errors import ConfigError, DataError
from pipecast.values.hardware.tiers import hierarchical_seconds, ring_seconds, span

FORMAT_VERSION = 1

CPU_PROBE_RANKS = 2
"""Ranks a CPU machine's calibration probes with (its links and the runtime's own work per
action and per step), whatever the ranks asked for."""

DDP_PARAM_HOST = 35e-6
"""Host seconds DistributedDataParallel adds per trainable parameter tensor (its autograd
hook, its copies into and out of a bucket), fixed rather than read: the probe's reading is
the difference of two noisy host times, and the fixed figure predicted DDP's host-bound
steps better (docs/decisions.md, "DDP's host cost per tensor")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """Point-to-point transfer cost: latency + bytes / bandwidth."""

    latency: float
    """Seconds."""
    bandwidth: float
    """Bytes per second."""

    def time(self, nbytes: float) -> float:
        return 0.0 if nbytes <= 0 else self.latency + nbytes / self.bandwidth


HOST_LINK = Link(latency=10e-6, bandwidth=20e9)
"""Device-host copies where nothing was measured: 20 GB/s, a PCIe 4.0 x16 slot's usual."""
HOST_OPTIMIZER_RATE = 2e9
"""Bytes of weights a second a host's Adam step covers where nothing was measured."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Nodes of identical GPUs. Ranks are numbered node by node."""

    name: str = "cluster"
    device: str = "unknown"
    """Device model, e.g. 'NVIDIA H100 80GB HBM3'."""
    nodes: int = 1
    gpus_per_node: int
    memory_bytes: int
    """Usable memory of one GPU."""
    matmul_flops: float = 0.0
    """Measured dense matmul rate of one GPU in FLOP/s (0: unknown)."""
    intra: Link
    """Link between two GPUs of one node."""
    inter: Link
    """Link between GPUs of different nodes of one pod: one GPU's own NICs (its rails,
    nics_per_gpu x a NIC's bandwidth), each GPU of a node on rails of its own."""
    nics_per_gpu: int = 1
    """NICs each GPU has to the network (rails per GPU); `inter` is all of them together."""
    nodes_per_pod: int = 0
    """Nodes under one pod's leaf switches, one hop apart rail by rail (a DGX SuperPOD's
    scalable unit: 32); 0: one pod holds every node."""
    oversubscription: float = 1.0
    """r of an r:1 oversubscribed spine between pods: traffic leaving a pod gets 1/r of its
    rails' bandwidth (1: non-blocking)."""
    allreduce_busbw: dict[int, float] = field(default_factory=dict)
    """Group size -> all-reduce bus bandwidth within a node (bytes/s, nccl-tests convention);
    empty: derived from the intra link."""
    allreduce_inter_busbw: float = 0.0
    """All-reduce bus bandwidth of one rail across nodes of a pod, the cross-node phase of
    a hierarchical all-reduce (0: the inter link's bandwidth)."""
    allreduce_latency: float = 0.0
    """Fixed cost of one all-reduce in seconds."""
    allgather_busbw: dict[int, float] = field(default_factory=dict)
    """Group size -> all-gather bus bandwidth within a node (bytes/s, nccl-tests convention:
    (n-1)/n x the gathered bytes over the seconds); empty: the all-reduce's, assumed."""
    reduce_scatter_busbw: dict[int, float] = field(default_factory=dict)
    """Group size -> reduce-scatter bus bandwidth within a node; empty: the all-reduce's,
    assumed."""
    shard_latency: float = 0.0
    """Fixed cost of one all-gather or reduce-scatter in seconds (0: the all-reduce's)."""
    pairs: dict[tuple[int, int], Link] = field(default_factory=dict)
    """Measured links for particular (src, dst) pairs; override intra/inter."""
    host_overhead: float = 0.0
    """Host seconds the pipeline runtime adds to each action beyond its ops (posting
    transfers, bookkeeping); it binds only where the host is the bottleneck."""
    step_overhead: float = 0.0
    """Seconds pipecast's runtime adds to every step over several GPUs around its actions:
    agreeing on the batch with the other ranks, waiting for the last transfers, the loss,
    the barrier between steps, which keep a measured step running a millisecond or two past
    its last action and the optimizer step (docs/decisions.md, "The runtime's step
    overhead"). One rank alone does none of it."""
    host_contention: dict[int, float] = field(default_factory=dict)
    """n -> how much slower a host issues work while n ranks of this node are busy than
    alone (profiles are taken alone); missing n: 1."""
    host_issue: dict[int, float] = field(default_factory=dict)
    """n -> hostspeed.issue() seconds in a rank while n ranks of this node issue at once (1:
    a rank alone). With a profile's own reading it turns the profile's host costs into a
    busy rank's; missing: host_contention alone is used."""

    cpu_compute: dict[int, float] = field(default_factory=dict)
    """CPU ranks only: n -> how much longer a fixed compute takes in each of n ranks running
    at once (each with the runtime's share of the cores) than in one process with every
    core, as the profiler runs. Ranks share the cores a profile had to itself; missing: 1."""
    machine: str = ""
    """hostspeed.machine() where the probe ran (empty: not recorded, or described)."""

    ddp_step_host: float = 0.0
    """Host seconds torch's DistributedDataParallel adds to a step whatever the model."""
    ddp_param_host: float = 0.0
    """... and per trainable parameter tensor (its autograd hook, its copies into and out of
    a bucket)."""
    ddp_buffer_host: float = 0.0
    """... and per buffer tensor (broadcast from rank 0 before every forward)."""
    host_optimizer_rate: float = HOST_OPTIMIZER_RATE
    """Bytes of fp32 weights per second an Adam step covers on the host, the optimizer's
    state there (what an offloaded optimizer's step costs beside the copies); the probe
    measures it, HOST_OPTIMIZER_RATE where nothing was measured."""
    host_optimizer_rate_16: float = HOST_OPTIMIZER_RATE
    """The same for 16-bit weights (bf16, fp16), which an Adam step covers at another rate
    per byte: each element is widened for the arithmetic and narrowed back."""

    def optimizer_rate(self, element_bytes: int) -> float:
        """Bytes per second of the host's Adam step over weights of `element_bytes` each."""
        return self.host_optimizer_rate_16 if element_bytes == 2 else self.host_optimizer_rate

    host_link: Link = HOST_LINK
    """Copies between a GPU and pinned host memory on a stream of their own while the GPU
    computes (the slower of the two directions): what offloaded activations cost. The
    default is a PCIe 4.0 x16 slot's usual rate; the probe measures it."""

    def host_factor(
        self, busy: int, profiled_issue: float = 0.0, profiled_on: str | None = None
    ) -> float:
        """How much slower a rank issues work with `busy` ranks busy on a node than the
        profiler did. A profile taken on the probe's own machine (`profiled_on` equal to
        `machine`, both unrecorded included): the probe's hostspeed.issue() with `busy`
        ranks at once over its own reading alone, both from the same interleaved rounds.
        A profile from elsewhere: the probe's reading over the profile's own
        (`profiled_issue`), which carries its host costs to this host's speed. Without
        issue readings, the contention factor (1 when unmeasured). Between measured
        counts, the nearest below.

        On one machine, the probe's own ratio (docs/decisions.md, "The busy rank's host
        factor"): the profile's reading is a spell of its own, minutes from the probe's, and
        a host that changed speed between the two moved every host cost by the change."""
        if self.host_issue:
            known = [n for n in self.host_issue if n <= busy] or [min(self.host_issue)]
            reading = self.host_issue[max(known)]
            if profiled_on is not None and profiled_on == self.machine and 1 in self.host_issue:
                return reading / self.host_issue[1]
            if profiled_issue > 0:
                return reading / profiled_issue
        known = [n for n in self.host_contention if n <= busy]
        return self.host_contention[max(known)] if known else 1.0

    def compute_factor(self, busy: int) -> float:
        """How much slower each of `busy` CPU ranks computes than the profiler did
        (cpu_compute, the nearest count measured at or below; 1 without readings)."""
        known = [n for n in self.cpu_compute if n <= busy]
        return self.cpu_compute[max(known)] if known else 1.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ConfigError(
                f"a cluster needs at least 1 node and 1 GPU per node, got nodes={self.nodes}, "
                f"gpus_per_node={self.gpus_per_node}"
            )
        if self.nics_per_gpu < 1 or self.nodes_per_pod < 0 or self.oversubscription < 1:
            raise ConfigError(
                "a cluster needs nics_per_gpu >= 1, nodes_per_pod >= 0 (0: one pod) and "
                f"oversubscription >= 1, got {self.nics_per_gpu}, {self.nodes_per_pod} and "
                f"{self.oversubscription}"
            )
        if self.memory_bytes <= 0:
            raise ConfigError(f"GPU memory must be positive, got {self.memory_bytes} bytes")
        for label, link in (
            ("intra-node", self.intra),
            ("inter-node", self.inter),
            ("host", self.host_link),
        ):
            if link.bandwidth <= 0 or link.latency < 0:
                raise ConfigError(
                    f"{label} link needs bandwidth > 0 and latency >= 0, got "
                    f"{link.bandwidth} B/s and {link.latency} s"
                )

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def pod_of(self, rank: int) -> int:
        """The pod of `rank`'s node (0 where one pod holds every node)."""
        return self.node_of(rank) // self.nodes_per_pod if self.nodes_per_pod else 0

    @property
    def nic_bandwidth(self) -> float:
        """Bytes per second of one NIC: the inter-node link over the NICs per GPU."""
        return self.inter.bandwidth / self.nics_per_gpu

    def network(self, pods: int) -> Link:
        """A GPU's link to other nodes for traffic within one pod (`pods` 1: its rails, the
        inter link) or across pods (its rails' bandwidth over the oversubscription)."""
        if pods <= 1 or self.oversubscription == 1:
            return self.inter
        return Link(
            latency=self.inter.latency, bandwidth=self.inter.bandwidth / self.oversubscription
        )

    def link(self, src: int, dst: int) -> Link:
        """Point to point: a measured pair's link, else NVLink within a node, the rails
        within a pod, the oversubscribed spine between pods (every pipeline rank at a pod's
        edge sends at once, so they share its uplinks)."""
        if (src, dst) in self.pairs:
            return self.pairs[(src, dst)]
        if self.node_of(src) == self.node_of(dst):
            return self.intra
        return self.network(1 if self.pod_of(src) == self.pod_of(dst) else 2)

    def allreduce_time(self, nbytes: float, ranks: Sequence[int]) -> float:
        """All-reduce of `nbytes` over `ranks`, priced by tier (tiers.py has the formulas):
        within a node, a ring at the node's bus bandwidth, 2(n-1)/n x bytes / busbw; across
        nodes, hierarchical: reduce-scatter in each node, an all-reduce across the nodes on
        1/g of the data on each of the g rails, all-gather in each node; the cross-node
        phase at the rails' bandwidth, over the oversubscription where the group spans
        pods."""
        n = len(ranks)
        if n <= 1 or nbytes <= 0:
            return 0.0
        where = span(ranks, self.gpus_per_node, self.nodes_per_pod)
        if where.nodes == 1:
            latency = self.allreduce_latency or 2 * (n - 1) * self.link(ranks[0], ranks[-1]).latency
            return latency + ring_seconds(nbytes, n, self._node_busbw(n))
        net = self.network(where.pods)
        net_busbw = net.bandwidth
        if self.allreduce_inter_busbw:
            net_busbw = self.allreduce_inter_busbw * net.bandwidth / self.inter.bandwidth
        g, k = where.per_node, where.nodes
        latency = self.allreduce_latency or (
            2 * (g - 1) * self.intra.latency + 2 * (k - 1) * net.latency
        )
        return latency + hierarchical_seconds(nbytes, where, self._node_busbw(g), net_busbw)

    def _node_busbw(self, n: int) -> float:
        """All-reduce bus bandwidth of `n` ranks of one node: the measured group size
        nearest at or above `n` (the largest measured above them all), else the intra
        link's."""
        return self._busbw(self.allreduce_busbw, n) or self.intra.bandwidth

    def _busbw(self, table: dict[int, float], n: int) -> float:
        """Bus bandwidth for a group of `n` within a node from `table` (the nearest size at or
        above `n` measured), else the all-reduce's."""
        if not table:
            return 0.0
        sizes = sorted(table)
        return table[sizes[min(bisect.bisect_left(sizes, n), len(sizes) - 1)]]

    def _sharded_time(self, table: dict[int, float], nbytes: float, ranks: Sequence[int]) -> float:
        n = len(ranks)
        if n <= 1 or nbytes <= 0:
            return 0.0
        spans = len({self.node_of(r) for r in ranks}) > 1
        busbw = 0.0 if spans else self._busbw(table, n)
        if not busbw:  # half an all-reduce: a ring moves (n-1)/n of the bytes once
            return self.allreduce_time(nbytes, ranks) / 2
        latency = self.shard_latency or self.allreduce_latency / 2
        latency = latency or (n - 1) * self.link(ranks[0], ranks[-1]).latency
        return latency + (n - 1) / n * nbytes / busbw

    def allgather_time(self, nbytes: float, ranks: Sequence[int]) -> float:
        """All-gather over `ranks` of a tensor `nbytes` in all (each rank holds 1/n):
        latency + (n-1)/n x bytes / bus bandwidth."""
        return self._sharded_time(self.allgather_busbw, nbytes, ranks)

    def reduce_scatter_time(self, nbytes: float, ranks: Sequence[int]) -> float:
        """Reduce-scatter over `ranks` of `nbytes` on every rank into a 1/n share each."""
        return self._sharded_time(self.reduce_scatter_busbw, nbytes, ranks)

    def subset(self, gpus: int) -> Cluster:
        """The same machine type with `gpus` GPUs (whole nodes first)."""
        if gpus <= self.gpus_per_node:
            return replace(self, nodes=1, gpus_per_node=gpus)
        if gpus % self.gpus_per_node:
            raise ConfigError(
                f"{gpus} GPUs is not a whole number of {self.gpus_per_node}-GPU nodes"
            )
        return replace(self, nodes=gpus // self.gpus_per_node)

    # ---- JSON ----------------------------------------------------------------------------

    def to_json(self) -> str:
        return jsonio.dump(
            "cluster",
            FORMAT_VERSION,
            {
                "name": self.name,
                "device": self.device,
                "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node,
                "memory_bytes": self.memory_bytes,
                "matmul_flops": self.matmul_flops,
                "intra": _link_json(self.intra),
                "inter": _link_json(self.inter),
                "nics_per_gpu": self.nics_per_gpu,
                "nodes_per_pod": self.nodes_per_pod,
                "oversubscription": self.oversubscription,
                "allreduce_busbw": {str(k): v for k, v in self.allreduce_busbw.items()},
                "allreduce_inter_busbw": self.allreduce_inter_busbw,
                "allreduce_latency": self.allreduce_latency,
                "allgather_busbw": {str(k): v for k, v in self.allgather_busbw.items()},
                "reduce_scatter_busbw": {str(k): v for k, v in self.reduce_scatter_busbw.items()},
                "shard_latency": self.shard_latency,
                "host_overhead": self.host_overhead,
                "step_overhead": self.step_overhead,
                "host_contention": {str(n): f for n, f in self.host_contention.items()},
                "host_issue": {str(n): s for n, s in self.host_issue.items()},
                "cpu_compute": {str(n): f for n, f in self.cpu_compute.items()},
                "machine": self.machine,
                "ddp_step_host": self.ddp_step_host,
                "ddp_param_host": self.ddp_param_host,
                "ddp_buffer_host": self.ddp_buffer_host,
                "pairs": [[a, b, _link_json(link)] for (a, b), link in self.pairs.items()],
                "host_link": _link_json(self.host_link),
                "host_optimizer_rate": self.host_optimizer_rate,
                "host_optimizer_rate_16": self.host_optimizer_rate_16,
            },
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Cluster:
        doc = jsonio.load("cluster", FORMAT_VERSION, text, source)
        return cluster_from_dict(doc, source)

    @classmethod
    def load(cls, path: str) -> Cluster:
        return cls.from_json(jsonio.read_text(path), source=path)

    def save(self, path: str) -> None:
        jsonio.write_atomic(path, self.to_json())


def _link_json(link: Link) -> dict[str, float]:
    return {"latency": link.latency, "bandwidth": link.bandwidth}


def cluster_from_dict(doc: dict[str, Any], source: str = "<dict>") -> Cluster:
    """A Cluster from a JSON document or a user's short description. Sizes and rates may be
    strings with units ('80GiB', '300GB/s', '5us'). A description may give the network as
    one NIC ("nic": {"bandwidth": "400Gbit/s", "latency": "5us"}) and "nics_per_gpu"
    instead of the inter link, which is then all of a GPU's NICs together."""
    from pipecast.values.hardware.units import parse_bytes, parse_rate, parse_seconds

    def link(value: Any, what: str) -> Link:
        if not isinstance(value, dict) or "bandwidth" not in value:
            raise DataError(f"{source}: '{what}' needs a bandwidth (and optionally latency)")
        return Link(
            latency=parse_seconds(value.get("latency", 0)), bandwidth=parse_rate(value["bandwidth"])
        )

    try:
        intra = link(doc["intra"], "intra")
        nics = int(doc.get("nics_per_gpu", 1))
        if "nic" in doc and "inter" in doc:
            raise DataError(
                f"{source} gives both 'nic' and 'inter': give one NIC ('nic', with "
                "'nics_per_gpu') or a GPU's whole link between nodes ('inter'), not both"
            )
        if "nic" in doc:
            nic = link(doc["nic"], "nic")
            inter = Link(latency=nic.latency, bandwidth=nic.bandwidth * nics)
        else:
            inter = link(doc.get("inter", doc["intra"]), "inter")
        return Cluster(
            name=str(doc.get("name", "cluster")),
            device=str(doc.get("device", "unknown")),
            nodes=int(doc.get("nodes", 1)),
            gpus_per_node=int(doc["gpus_per_node"]),
            memory_bytes=parse_bytes(
                doc["memory_bytes"] if "memory_bytes" in doc else doc["memory"]
            ),
            matmul_flops=float(doc.get("matmul_flops", 0.0)),
            intra=intra,
            inter=inter,
            nics_per_gpu=nics,
            nodes_per_pod=int(doc.get("nodes_per_pod", 0)),
            oversubscription=float(doc.get("oversubscription", 1.0)),
            allreduce_busbw={
                int(k): parse_rate(v) for k, v in doc.get("allreduce_busbw", {}).items()
            },
            allreduce_inter_busbw=parse_rate(doc.get("allreduce_inter_busbw", 0.0)),
            allreduce_latency=parse_seconds(doc.get("allreduce_latency", 0.0)),
            allgather_busbw={
                int(k): parse_rate(v) for k, v in doc.get("allgather_busbw", {}).items()
            },
            reduce_scatter_busbw={
                int(k): parse_rate(v) for k, v in doc.get("reduce_scatter_busbw", {}).items()
            },
            shard_latency=parse_seconds(doc.get("shard_latency", 0.0)),
            host_overhead=parse_seconds(doc.get("host_overhead", 0.0)),
            step_overhead=parse_seconds(doc.get("step_overhead", 0.0)),
            host_contention={int(n): float(f) for n, f in doc.get("host_contention", {}).items()},
            host_issue={int(n): parse_seconds(v) for n, v in doc.get("host_issue", {}).items()},
            cpu_compute={int(n): float(f) for n, f in doc.get("cpu_compute", {}).items()},
            machine=str(doc.get("machine", "")),
            ddp_step_host=parse_seconds(doc.get("ddp_step_host", 0.0)),
            ddp_param_host=parse_seconds(doc.get("ddp_param_host", 0.0)),
            ddp_buffer_host=parse_seconds(doc.get("ddp_buffer_host", 0.0)),
            pairs={(int(a), int(b)): link(v, f"pair {a}-{b}") for a, b, v in doc.get("pairs", [])},
            host_link=link(doc["host_link"], "host_link") if "host_link" in doc else HOST_LINK,
            host_optimizer_rate=parse_rate(doc.get("host_optimizer_rate", HOST_OPTIMIZER_RATE)),
            host_optimizer_rate_16=parse_rate(
                doc.get("host_optimizer_rate_16", HOST_OPTIMIZER_RATE)
            ),
        )
    except KeyError as exc:
        raise DataError(f"{source} describes no cluster: missing {exc}") from None
