"""A lower bound on a strategy's predicted step, priced from the profile alone in
microseconds, for recommend's branch and bound (planning.recommend.search).

Why it holds: in the simulator a rank's device runs its actions one after another, each no
shorter than its stage's compute (F, then B + W or the whole backward, the forward again
where it recomputes), and a rank's first action waits for micro-batch 0's forward through
every stage before it. So with stages [a_r, b_r) on ranks r, one stage a rank,

    step >= max_r ( F(0, a_r) + M * C(a_r, b_r) ) + the runtime's step overhead,

F and C the blocks' forward and forward + backward seconds per micro-batch at the strategy's
micro-batch size (each no more than what pricing charges: the lesser of the eager and the
graphed time, tensor parallelism's all-reduces, which sit on the compute's stream, on top),
M the micro-batches. Its least value over every split of the blocks into S stages bounds
whatever split the partition method picks: a bisection on T, each T tried by the greedy
split that ends each stage as late as T allows (the latest end is monotone in the stage's
start, so the greedy split is optimal). Ranks that hold several stages (interleaved, ZB-V)
are bounded by the mean over the ranks of the same sum, each rank's first stage starting
after at least as many blocks as there are ranks before it. The all-reduces, the optimizer
step and transfers only add to it, and are left out.

A strategy this does not cover (context parallelism, offloaded, selective recomputation,
serving) is bounded by 0: it is always priced.
"""

from __future__ import annotations

import bisect
from itertools import accumulate

from pipecast.errors import PipecastError
from pipecast.planning.recommend.mesh import planned
from pipecast.planning.recommend.predict import micro_batch_of
from pipecast.planning.schedules.generators import stages_per_rank
from pipecast.planning.simulation.pricing import cpu_turns
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.tensor_plans import FALLBACK_REDUCES
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

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
        if (
            s.schedule == "forward-only"
            or s.cp > 1
            or s.offload != "none"
            or s.recompute not in ("none", "all")
        ):
            return 0.0
        try:
            size = micro_batch_of(self.batch, s)
            f, c = self._per_block(profile, s, size)
        except PipecastError:
            return 0.0  # priced, and rejected there with the reason
        m = s.microbatches
        pipelined = s.kind in ("pipeline", "hybrid") and s.stages > 1
        if not pipelined:
            bound = m * sum(c)
        elif stages_per_rank(s.schedule, s.virtual) == 1:
            bound = self._least_split(f, c, m, s.stages)
        else:
            firsts = list(accumulate(f, initial=0.0))[: s.stages]
            bound = sum(firsts) / s.stages + m * sum(c) / s.stages
        if s.gpus > 1 and self.cluster.step_overhead:
            turns = cpu_turns(profile, self.cluster, s.gpus) if profile.device == "cpu" else 1.0
            bound += self.cluster.step_overhead * turns
        return bound

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
        key = (id(f), m, stages)
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
