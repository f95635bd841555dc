"""A lower bound on a strategy's predicted step, priced from the profile alone in
microseconds, for recommend's branch and bound (planning.recommend.search).

Why it holds: in the simulator a rank's device runs its actions one after another, each no
shorter than its stage's compute (F, then B + W or the whole backward, the forward again
where it recomputes), and a rank's first action waits for micro-batch 0's forward through
every stage before it. Where the backward is one action (GPipe, 1F1B, interleaved), a
rank's last action is a backward, and the same micro-batch's backwards through every stage
before it come after it. So with stages [a_r, b_r) on ranks r, one stage a rank,

    step >= max_r ( P(0, a_r) + M * C(a_r, b_r) ) + the runtime's step overhead,

P the blocks' forward seconds (forward + backward where the backward is one action) and C
their forward + backward seconds per micro-batch at the strategy's
micro-batch size (each no more than what pricing charges: the lesser of the eager and the
graphed time, tensor parallelism's all-reduces, which sit on the compute's stream, on top),
M the micro-batches. Its least value over every split of the blocks into S stages bounds
whatever split the partition method picks: a bisection on T, each T tried by the greedy
split that ends each stage as late as T allows (the latest end is monotone in the stage's
start, so the greedy split is optimal). Ranks that hold several stages (interleaved, ZB-V)
are bounded by the mean over the ranks of the same sum, each rank's first stage starting
after at least as many blocks as there are ranks before it (and its last backward's stage
as many). The all-reduces, the optimizer
step and transfers only add to it, and are left out.

Offloaded strategies add what moves over the host link (Bounds._host_seconds) to the mean
rank's time. A strategy this does not cover (context parallelism, selective recomputation,
serving) is bounded by 0: it is always priced.
"""

from __future__ import annotations

import bisect
from itertools import accumulate

from pipecast.errors import PipecastError
from pipecast.planning.recommend.mesh import planned
from pipecast.planning.recommend.predict import micro_batch_of
from pipecast.planning.schedules.generators import stages_per_rank
from pipecast.planning.simulation.pricing import cpu_turns, weight_bytes
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.tensor_plans import FALLBACK_REDUCES
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy
from pipecast.values.training import (
    OPTIMIZER_STATE,
    Optimizer,
    offloads_activations,
    offloads_optimizer,
    offloads_weights,
)

SPLIT = ("zb-h1", "zb-v", "zb-auto")
"""Schedules whose backward runs as B and W."""


class Bounds:
    """Lower bounds of strategies' steps on one cluster for one global batch, the per-block
    seconds cached by what they depend on."""

    def __init__(self, cluster: Cluster, batch: int) -> None:
        self.cluster, self.batch = cluster, batch
        self._blocks: dict[tuple[int, int, int, bool, bool], tuple[list[float], list[float]]] = {}
        self._split: dict[tuple[int, ...], float] = {}

    def step(self, profile: Profile, strategy: Strategy) -> float:
        """A lower bound on predict(profile, cluster, strategy, batch).step_time (0: none
        known)."""
        s = strategy
        if s.schedule == "forward-only" or s.cp > 1 or s.recompute not in ("none", "all"):
            return 0.0
        try:
            size = micro_batch_of(self.batch, s)
            f, c = self._per_block(profile, s, size)
        except PipecastError:
            return 0.0  # priced, and rejected there with the reason
        m = s.microbatches
        pipelined = s.kind in ("pipeline", "hybrid") and s.stages > 1
        ranks = s.stages if pipelined else 1
        stages = ranks * (stages_per_rank(s.schedule, s.virtual) if pipelined else 1)
        busy, step = self._host_seconds(profile, s, size, stages, sum(c))
        # the chain before a rank's work and after it: the forwards of micro-batch 0 through
        # the stages before; where the backward is one action, also the backwards of its
        # last micro-batch back through them (a split backward passes B on and may end
        # with Ws, so only the forwards count)
        chain = f if s.schedule in SPLIT else c
        firsts = list(accumulate(chain, initial=0.0))[:ranks]
        bound = sum(firsts) / ranks + (m * busy + step) / ranks  # the mean rank
        if not pipelined:
            bound = max(bound, m * sum(c))
        elif stages == ranks:
            bound = max(bound, self._least_split(chain, c, m, ranks))
        if s.gpus > 1 and self.cluster.step_overhead:
            turns = cpu_turns(profile, self.cluster, s.gpus) if profile.device == "cpu" else 1.0
            bound += self.cluster.step_overhead * turns
        return bound

    def memory(self, profile: Profile, s: Strategy, optimizer: Optimizer) -> int:
        """A lower bound on the strategy's predicted peak bytes per GPU (0: none known):
        the mean rank's share of what the ranks hold whatever the order (weights, their
        gradients and the optimizer's state, simulation.memory.fixed_memory, with the
        sharded.sharded_step on one stage) and, beside it at some moment, one micro-batch's
        saved activations of one of its stages: after the forward, or recomputed in the
        backward (but for a sharded recomputed stage, which recomputes a block at a time),
        or the all-reduce's copy of the gradients where whole copies are replicated."""
        if s.schedule == "forward-only" or s.cp > 1 or s.offload != "none":
            return 0
        try:
            rank = profile.at_tensor_parallel(s.tp)
            size = micro_batch_of(self.batch, s)
        except PipecastError:
            return 0
        weights = rank.param_bytes
        state = OPTIMIZER_STATE[optimizer]
        pipelined = s.kind in ("pipeline", "hybrid") and s.stages > 1
        if s.sharded and not pipelined:
            held = weights * (2.0 + state) / s.replicas
        elif s.sharded:
            held = weights * (2.0 + (2.0 + state) / s.replicas)
        else:
            kept = 1 / s.replicas if s.shard_optimizer else 1.0
            held = weights * (2.0 + state * kept)
        saved = 0.0
        if not (s.sharded and s.recompute != "none"):
            saved = sum(rank.cost(i, size).saved_bytes for i in range(rank.num_blocks))
            saved /= stages_per_rank(s.schedule, s.virtual) if pipelined else 1
        if s.replicas > 1 and not s.sharded:  # eagerly, the copy reuses what activations freed
            saved = max(saved, weights)
        return int((held + saved) / (s.stages if pipelined else 1))

    def _host_seconds(
        self, profile: Profile, s: Strategy, size: int, stages: int, compute: float
    ) -> tuple[float, float]:
        """(Seconds every stage's actions take for one micro-batch, in all, no less than
        `compute`; seconds of every stage's optimizer step) with what `s.offload` moves
        to and from the host over `cluster.host_link` (pricing._offloaded): streamed
        weights come in for each forward and input backward, beside the compute; offloaded
        activations come back in each backward, on top of it (a recomputed micro-batch
        keeps none); the optimizer's state on the host costs its copies and its step
        after the backward where the runtime does not overlap them (several replicas, or
        graphed). Each copy is at least its bytes over the link's rate, and the stages'
        bytes add up to the whole model's."""
        if s.offload == "none":
            return compute, 0.0
        rank = profile.at_tensor_parallel(s.tp)
        rate = self.cluster.host_link.bandwidth
        weights = rank.param_bytes / rate
        busy, step = compute, 0.0
        restored = offloads_activations(s.offload) and s.recompute == "none"
        if restored:
            costs = [rank.cost(i, size) for i in range(rank.num_blocks)]
            outputs = max(c.output_bytes for c in costs) * (stages - 1)
            busy += max(sum(c.saved_bytes for c in costs) - outputs, 0) / rate
        if offloads_weights(s.offload):
            busy = busy + weights if restored else max(busy, 2 * weights)
        if offloads_optimizer(s.offload) and (s.cuda_graphs or s.replicas > 1):
            moved = 1 if offloads_weights(s.offload) else 2
            step = moved * weights + rank.param_bytes / self.cluster.optimizer_rate(
                weight_bytes(rank)
            )
        return busy, step

    def _per_block(
        self, profile: Profile, s: Strategy, size: int
    ) -> tuple[list[float], list[float]]:
        """Each block's forward and forward + backward seconds, no more than pricing charges."""
        weight = s.schedule in SPLIT and s.weight_batch == 1  # a batched W may cost less
        key = (id(profile), s.tp, size, s.recompute == "all", weight)
        if key not in self._blocks:
            self._blocks[key] = self._seconds(profile, s.tp, size, s.recompute == "all", weight)
        return self._blocks[key]

    def _seconds(
        self, whole: Profile, tp: int, size: int, recompute: bool, weight: bool
    ) -> tuple[list[float], list[float]]:
        rank = whole.at_tensor_parallel(tp)
        costs = [rank.cost(i, size) for i in range(rank.num_blocks)]
        graphed = rank.graph_times
        ratio = min((c.graph_backward / c.backward for c in costs if c.backward > 0), default=1.0)
        f, c = [], []
        for i, cost in enumerate(costs):
            fwd = min(cost.forward, cost.graph_forward) if graphed else cost.forward
            parts = cost.backward_input + (cost.backward_weight if weight else 0.0)
            options = [cost.backward, parts]
            if graphed:
                options += [cost.graph_backward, parts * min(ratio, 1.0)]
            bwd = max(min(options), 0.0)
            if tp > 1 and self.cluster.gpus_per_node % tp == 0 and planned(whole, tp, i):
                reduces = _tp_seconds(whole, rank, i, size, self.cluster, tp)
                fwd, bwd = fwd + reduces[0], bwd + reduces[1]
            if recompute:
                bwd += fwd
            f.append(fwd)
            c.append(fwd + bwd)
        loss_forward, _ = rank.loss_cost(size)
        alone = rank.loss_alone_cost(size) if graphed else None
        extra = min(loss_forward, alone[0]) if alone else loss_forward
        f[-1] += extra
        c[-1] += extra
        return f, c

    def _least_split(self, f: list[float], c: list[float], m: int, stages: int) -> float:
        """The least over splits of the blocks into `stages` stages of max_r F(0, a_r) + m
        C(a_r, b_r): a value no split beats (the bisection's infeasible end)."""
        key = (id(f), id(c), m, stages)
        if key in self._split:
            return self._split[key]
        n = len(c)
        fpre = list(accumulate(f, initial=0.0))
        cpre = [m * x for x in accumulate(c, initial=0.0)]
        lead = [cpre[a] - fpre[a] for a in range(n + 1)]  # nondecreasing: m c_i >= f_i

        def feasible(t: float) -> bool:
            a = 0
            for _ in range(min(stages, n)):
                b = bisect.bisect_right(cpre, t + lead[a], lo=a + 1) - 1
                if b <= a:
                    return False
                a = b
                if a == n:
                    return True
            return False

        low = cpre[n] / stages  # the mean rank's compute: no split does better
        high = cpre[n] + fpre[n]
        if feasible(low):
            self._split[key] = low
            return low
        for _ in range(40):
            mid = (low + high) / 2
            if feasible(mid):
                high = mid
            else:
                low = mid
            if high - low <= 1e-9 * high:
                break
        self._split[key] = low
        return low


def _tp_seconds(
    whole: Profile, rank: Profile, block: int, size: int, cluster: Cluster, tp: int
) -> tuple[float, float]:
    """Tensor parallelism's all-reduces in block `block`'s forward and backward, over a
    group of `tp` ranks within one node (mesh.tp_collectives' pricing)."""
    counts = rank.blocks[block].tp_reduces or FALLBACK_REDUCES
    seconds = cluster.allreduce_time(whole.cost(block, size).output_bytes, range(tp))
    return counts[0] * seconds, counts[1] * seconds
