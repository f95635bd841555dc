"""The strategies a user would consider for G GPUs and a global batch."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace

from pipecast.planning.recommend.context_degrees import split_sequences
from pipecast.planning.recommend.depths import pipeline_depths, virtual_counts
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Kind, Shard, Strategy
from pipecast.values.training import Recompute

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "zb-auto")
SPLIT_SCHEDULES = ("zb-h1", "zb-v", "zb-auto")
"""The schedules whose backward is B then W."""
WEIGHT_BATCHES = (1, 2, 4)
"""Micro-batches whose W may run as one, where the profile read what that saves."""


def batches_weights(profile: Profile) -> bool:
    """Whether `profile` read a batched W (BlockCost.batched_weight) at its smallest size,
    where batching helps most: without it, a batched W would be priced at no saving."""
    size = min(profile.blocks[0].costs)
    return any(b.costs[size].batched_weight > 0 for b in profile.blocks)


ACCUMULATION = 8
"""Gradient accumulation counts up to this are always considered for one GPU and for data
parallelism."""
SHARDS: tuple[Shard, ...] = ("none", "full", "grad")
"""How data-parallel replicas may hold the weights: whole copies, or sharded by FSDP."""
HYBRID_SHARDS: dict[bool, tuple[Shard, ...]] = {False: ("none",), True: ("none", "grad")}
"""The same for a pipeline's replicas (none without replicas)."""
MORE_ACCUMULATION = 1024
"""Beyond ACCUMULATION, doubling counts up to this are offered for a batch whose share of a
GPU fits in no smaller count: recommend() tries one only where every smaller count of the
same strategy ran out of memory."""


def graphed(strategies: Iterator[Strategy]) -> Iterator[Strategy]:
    """Each strategy as the runtime runs it on GPUs: every action replayed as a CUDA graph
    (all but PipeDream's, which this enumeration does not offer), except where torch's FSDP
    or tensor parallelism runs the blocks, or a sequence is split: those run eagerly."""
    for s in strategies:
        eager = s.shard != "none" or s.tp > 1 or s.cp > 1
        yield s if eager else Strategy(**{**s.to_dict(), "cuda_graphs": True})


def gpu_counts(gpus: int) -> list[int]:
    """1, 2, 4, ... up to `gpus`, and `gpus` itself."""
    counts, g = [], 1
    while g < gpus:
        counts.append(g)
        g *= 2
    return [*counts, gpus]


def _divisors_pow2(n: int, limit: int = 64) -> list[int]:
    out, m = [], 1
    while m <= min(n, limit):
        if n % m == 0:
            out.append(m)
        m *= 2
    return out


def strategies(
    gpus: int,
    batch: int,
    *,
    blocks: int,
    schedules: Sequence[str] = PIPELINE_SCHEDULES,
    methods: Sequence[str] = ("balanced",),
    recompute: bool = True,
    serving: bool = False,
    tensor_parallel: Sequence[int] = (),
    weight_batches: Sequence[int] = (1,),
    shard_optimizer: bool = False,
    context_parallel: Sequence[int] = (),
    shares: int = 0,
) -> Iterator[Strategy]:
    """Every single-GPU, data-parallel (whole copies, or sharded by FSDP), pipeline and hybrid
    strategy on up to `gpus` GPUs, each also with its blocks split over each degree in
    `tensor_parallel` (those the profile has costs for) that divides the GPUs; a profile
    of one rank's `shares` alone (Profile.shares) has no whole blocks, so only that degree.

    Micro-batch counts are powers of two that divide the batch: up to MORE_ACCUMULATION, in
    rising order, for accumulation (see ACCUMULATION), and S, 2S, 4S, 8S for pipelines of S
    stages. Each comes with every block recomputed too, right after its plain self (rank.py
    prices that only where the plain one does not fit). Pipeline depths and the interleaved
    schedule's virtual stages per rank are depths.py's. A pipeline's replicas shard its
    stages kept gathered through the step ('grad', as torchtitan runs them). `serving`:
    inference, every strategy running forward only (replicas each serve their share of the
    batch; no recomputation, nothing to update). Split-backward schedules also run with each
    of `weight_batches` (Plan.weight_batch) that leaves at least two groups, without
    recomputation. `shard_optimizer`: replicas that hold whole copies of the weights are
    offered with the optimizer's state sharded over them as well (ZeRO-1,
    Strategy.shard_optimizer; not beside tensor parallelism). Then, for each degree c in
    `context_parallel`, the strategies of `gpus` / c ranks that
    context_degrees.split_sequences keeps, each sequence split over c GPUs."""
    if serving:
        yield from _serving(gpus, batch, blocks, methods)
        return
    for g in gpu_counts(gpus):
        for tp in _tp_degrees(g, tensor_parallel, shares):
            for s in _on(g // tp, batch, blocks, schedules, methods, recompute, tp):
                yield s
                if shard_optimizer and s.replicas > 1 and s.shard == "none" and tp == 1:
                    yield replace(s, shard_optimizer=True)
                if s.schedule in SPLIT_SCHEDULES and s.stages > 1 and s.recompute == "none":
                    for k in (k for k in weight_batches if k > 1 and 2 * k <= s.microbatches):
                        yield Strategy(**{**s.to_dict(), "weight_batch": k})
    if shares > 1:  # context parallelism is offered beside whole blocks only
        return
    for c in context_parallel:
        ranks = strategies(
            gpus // c,
            batch,
            blocks=blocks,
            schedules=schedules,
            methods=methods,
            recompute=recompute,
            weight_batches=weight_batches,
        )
        yield from split_sequences(c, ranks)


def _tp_degrees(gpus: int, tensor_parallel: Sequence[int], shares: int) -> tuple[int, ...]:
    """The tensor-parallel degrees a strategy on `gpus` GPUs may take (strategies)."""
    if shares > 1:
        return (shares,) if gpus % shares == 0 else ()
    return (1, *(t for t in tensor_parallel if t > 1 and gpus % t == 0))


def _on(
    g: int,
    batch: int,
    blocks: int,
    schedules: Sequence[str],
    methods: Sequence[str],
    recompute: bool,
    tp: int,
) -> Iterator[Strategy]:
    """The strategies of `g` data and pipeline ranks, each rank `tp` GPUs."""
    share = batch // g if batch % g == 0 else 0
    options: tuple[Recompute, ...] = ("none", "all") if recompute else ("none",)
    for m in _divisors_pow2(share, MORE_ACCUMULATION) if share else []:
        for rc in options:  # each recomputed after its plain self (rank.py skips it there)
            if g == 1:
                yield Strategy(kind="single", replicas=1, microbatches=m, tp=tp, recompute=rc)
                continue
            for shard in SHARDS:
                yield Strategy(
                    kind="data", replicas=g, microbatches=m, shard=shard, tp=tp, recompute=rc
                )
    for stages in pipeline_depths(g, blocks):
        replicas = g // stages
        if batch % replicas:
            continue
        per_replica = batch // replicas
        for schedule, virtual in (
            (name, v if name == "interleaved" else 0)
            for name in schedules
            for v in virtual_counts(name, stages, blocks)
        ):
            for factor in (1, 2, 4, 8):
                m = stages * factor
                if per_replica % m:
                    continue
                for method in methods:
                    for rc, shard in itertools.product(options, HYBRID_SHARDS[replicas > 1]):
                        yield Strategy(
                            kind="pipeline" if replicas == 1 else "hybrid",
                            stages=stages,
                            replicas=replicas,
                            schedule=schedule,
                            virtual=virtual,
                            microbatches=m,
                            partition=method,
                            recompute=rc,
                            shard=shard,
                            tp=tp,
                        )


def _serving(gpus: int, batch: int, blocks: int, methods: Sequence[str]) -> Iterator[Strategy]:
    """Forward-only strategies: one device or replicas, each running its share in 1-8
    micro-batches; pipelines of S stages over 1 (one request's latency), S, 2S, 4S or 8S."""
    for g in gpu_counts(gpus):
        share = batch // g if batch % g == 0 else 0
        for m in _divisors_pow2(share, ACCUMULATION) if share else []:
            kind: Kind = "single" if g == 1 else "data"
            yield Strategy(kind=kind, replicas=g, microbatches=m, schedule="forward-only")
        for stages in (s for s in pipeline_depths(g, blocks) if s <= blocks):
            replicas = g // stages
            if batch % replicas:
                continue
            per_replica = batch // replicas
            for m in dict.fromkeys((1, stages, 2 * stages, 4 * stages, 8 * stages)):
                if per_replica % m:
                    continue
                for method in methods:
                    yield Strategy(
                        kind="pipeline" if replicas == 1 else "hybrid",
                        stages=stages,
                        replicas=replicas,
                        schedule="forward-only",
                        microbatches=m,
                        partition=method,
                    )
