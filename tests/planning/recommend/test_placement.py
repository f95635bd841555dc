"""What the planner prices is where the runtime puts the ranks.

The runtime numbers a job's processes replica-major, tensor-parallel rank innermost
(rank = (replica x pipeline ranks + pipeline rank) x tp + t, as init_device_mesh numbers a
(replicas, pipeline ranks, tp) mesh). With tensor parallelism over a whole node, the
replicas and the pipeline neighbours of a rank sit on other nodes, so their traffic must be
priced on the link between nodes (issue 67: it was priced on device ids counted without
the tensor-parallel stride, inside the first node).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.predict import predict
from pipecast.values.hardware.cluster import Cluster, Link
from pipecast.values.hardware.presets import describe
from pipecast.values.parallel import Layout
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

Price = Callable[[float, Sequence[int]], float]

TP = 8
"""Tensor-parallel degree: one whole node of 8 GPUs."""


def _profile() -> Profile:
    """Four blocks of 80 MB of weights and 8 MB outputs, 1 ms forward each, each split over
    4 or 8 tensor-parallel ranks (a quarter or an eighth of the weights on a rank)."""
    p = make_profile([1e-3] * 4, params=[80_000_000] * 4, out_bytes=[8_000_000] * 4)
    return replace(
        p,
        tensor_parallel={
            t: tuple(replace(b, param_bytes=b.param_bytes // t) for b in p.blocks) for t in (4, 8)
        },
    )


EXAMPLES = {
    # name: (nodes of 8 GPUs, strategy, a slow link between nodes)
    "FSDP x2 x TP x8": (2, Strategy(kind="data", replicas=2, shard="full", tp=TP), "1GB/s"),
    "data parallel x2 x TP x8": (2, Strategy(kind="data", replicas=2, tp=TP), "1GB/s"),
    "2 stages x TP x8": (
        2,
        Strategy(kind="pipeline", stages=2, microbatches=4, tp=TP),
        "0.1GB/s",
    ),
    "FSDP x8 x TP x8": (8, Strategy(kind="data", replicas=8, shard="full", tp=TP), "1GB/s"),
    # two replicas on each node: the FSDP group reduces in the node, then across on 2 rails
    "FSDP x16 x TP x4": (8, Strategy(kind="data", replicas=16, shard="full", tp=4), "1GB/s"),
}
MORE = {
    "2 x interleaved 2 ranks x TP x4": (
        2,
        Strategy(kind="hybrid", stages=2, replicas=2, schedule="interleaved", microbatches=4, tp=4),
        "",
    ),
}
WITHOUT_TP = {
    "2 x 2 stages": (1, Strategy(kind="hybrid", stages=2, replicas=2, microbatches=4), ""),
}
"""A control: without tensor parallelism the numbering had no stride to miss."""


def _step(nodes: int, strategy: Strategy, inter: str) -> float:
    cluster = describe(gpus_per_node=8, nodes=nodes, memory="80GiB", inter_bandwidth=inter)
    batch = 8 * strategy.replicas * strategy.microbatches
    return predict(_profile(), cluster, strategy, batch).step_time


@pytest.mark.parametrize("name", EXAMPLES)
def test_traffic_between_nodes_is_priced_on_the_link_between_them(name: str) -> None:
    """Each example's replicas (or pipeline neighbours) sit on different nodes, so a slower
    link between nodes makes the step slower (issue 67: the same step at 50 GB/s and at
    1 or 0.1 GB/s)."""
    nodes, strategy, slow = EXAMPLES[name]
    assert _step(nodes, strategy, slow) > _step(nodes, strategy, "50GB/s")


PODS = {
    # name: (nodes per pod, whether the job's traffic crosses pods)
    "FSDP x8 x TP x8": (4, True),  # replicas 0-3 in pod 0, 4-7 in pod 1
    "2 stages x TP x8": (1, True),  # pipeline rank 1 in the second pod
    "data parallel x2 x TP x8": (2, False),  # both nodes in one pod
}


@pytest.mark.parametrize("name", PODS)
def test_traffic_between_pods_is_priced_on_the_oversubscribed_spine(name: str) -> None:
    """A 4:1 spine between pods slows the step of a job whose groups or pipeline neighbours
    sit in different pods, and leaves one inside a pod as it was."""
    nodes, strategy, _ = EXAMPLES[name]
    nodes_per_pod, crosses = PODS[name]

    def step(oversubscription: float) -> float:
        cluster = replace(
            describe(gpus_per_node=8, nodes=nodes, memory="80GiB"),
            nodes_per_pod=nodes_per_pod,
            oversubscription=oversubscription,
        )
        batch = 8 * strategy.replicas * strategy.microbatches
        return predict(_profile(), cluster, strategy, batch).step_time

    if crosses:
        assert step(4.0) > step(1.0)
    else:
        assert step(4.0) == step(1.0)


def _recording(cluster: Cluster, priced: list[tuple[str, tuple[int, ...]]]) -> Cluster:
    """`cluster`, noting every group a collective is priced over and every link priced on
    its own (a collective's own latency link is its group's, not noted again)."""
    depth = [0]

    class Recording(Cluster):
        def link(self, src: int, dst: int) -> Link:
            if depth[0] == 0 and src != dst:
                priced.append(("link", (src, dst)))
            return super().link(src, dst)

        def allreduce_time(self, nbytes: float, ranks: Sequence[int]) -> float:
            return self._collective("all-reduce", nbytes, ranks, super().allreduce_time)

        def allgather_time(self, nbytes: float, ranks: Sequence[int]) -> float:
            return self._collective("all-gather", nbytes, ranks, super().allgather_time)

        def reduce_scatter_time(self, nbytes: float, ranks: Sequence[int]) -> float:
            return self._collective("reduce-scatter", nbytes, ranks, super().reduce_scatter_time)

        def _collective(
            self, kind: str, nbytes: float, ranks: Sequence[int], price: Price
        ) -> float:
            if len(ranks) > 1:
                priced.append(("group", tuple(sorted(ranks))))
            depth[0] += 1
            try:
                return price(nbytes, ranks)
            finally:
                depth[0] -= 1

    return Recording(**{f: getattr(cluster, f) for f in cluster.__dataclass_fields__})


def _runtime_groups(strategy: Strategy) -> tuple[set[tuple[int, ...]], set[tuple[int, int]]]:
    """The groups the runtime builds for `strategy`'s ranks (values/parallel.py's Layout, as
    runtime/job.py lays them out): each place's replicas and tensor-parallel ranks; and the
    pairs of pipeline neighbours, both ways."""
    layout = Layout(replicas=strategy.replicas, pipeline=strategy.stages, tensor=strategy.tp)
    ranks = range(layout.world)
    groups = {layout.group("data", r) for r in ranks} | {layout.group("tensor", r) for r in ranks}
    pairs = {(r, n) for r in ranks for n in layout.group("pipeline", r) if n != r}
    return groups, pairs


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # by hand: replica k's tensor-parallel rank 0 is global rank 8k (node k)
        ("FSDP x2 x TP x8", ("group", (0, 8))),
        ("data parallel x2 x TP x8", ("group", (0, 8))),
        ("FSDP x8 x TP x8", ("group", (0, 8, 16, 24, 32, 40, 48, 56))),
        ("FSDP x16 x TP x4", ("group", tuple(range(0, 64, 4)))),
        # pipeline rank 1's tensor-parallel rank 0 is global rank 8 (node 1)
        ("2 stages x TP x8", ("link", (0, 8))),
        # pipeline rank 1's tensor-parallel ranks
        ("2 stages x TP x8", ("group", tuple(range(8, 16)))),
        # replica 1 on node 1; stage 1 on ranks 4-7, stage 2 back on 0-3
        ("2 x interleaved 2 ranks x TP x4", ("group", (0, 8))),
        ("2 x interleaved 2 ranks x TP x4", ("link", (4, 0))),
        ("2 x interleaved 2 ranks x TP x4", ("group", (4, 5, 6, 7))),
        # pipeline rank 0 of replica 1 is global rank 2; replica 0's transfers are priced
        ("2 x 2 stages", ("group", (0, 2))),
        ("2 x 2 stages", ("link", (0, 1))),
    ],
)
def test_what_is_priced_is_the_runtimes_groups(
    name: str, expected: tuple[str, tuple[int, ...]]
) -> None:
    """Every collective priced runs over a group the runtime builds (a stage's replicas, or
    a replica's tensor-parallel ranks) and every transfer between pipeline neighbours of
    the runtime's layout; the example's cross-node group (by hand) is among them."""
    nodes, strategy, _ = {**EXAMPLES, **MORE, **WITHOUT_TP}[name]
    priced: list[tuple[str, tuple[int, ...]]] = []
    cluster = _recording(describe(gpus_per_node=8, nodes=nodes, memory="80GiB"), priced)
    predict(_profile(), cluster, strategy, 8 * strategy.replicas * strategy.microbatches)
    groups, pairs = _runtime_groups(strategy)
    assert expected in priced
    for kind, ranks in priced:
        if kind == "group":
            assert ranks in groups, f"{name}: a collective priced over {ranks}"
        else:
            assert ranks in pairs, f"{name}: a transfer priced between {ranks}"
