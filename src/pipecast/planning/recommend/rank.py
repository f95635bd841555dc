"""Predict every strategy, drop what does not fit, rank the rest, explain the winner."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from pipecast.errors import ConfigError, PipecastError
from pipecast.planning.partition.methods import check_margin, check_methods
from pipecast.planning.recommend.bound import Bounds
from pipecast.planning.recommend.context_degrees import context_degrees
from pipecast.planning.recommend.enumerate import (
    ACCUMULATION,
    WEIGHT_BATCHES,
    batches_weights,
    graphed,
    strategies,
)
from pipecast.planning.recommend.predict import (
    CPU_ERROR_RANGE,
    ERROR_RANGE,
    OverMemory,
    Prediction,
    predict,
    with_exposed,
)
from pipecast.planning.recommend.search import Rules, Search
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.peak import PeakRate, peak_rate
from pipecast.values.hardware.units import human_bytes, per_rank
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy
from pipecast.values.training import (
    OFFLOADS,
    OPTIMIZER_STATE,
    Compile,
    Optimizer,
    why_not_streamed,
)


@dataclass(frozen=True, kw_only=True)
class Rejected:
    strategy: Strategy
    reason: str
    short: int = 0
    """Bytes per GPU it lacks, where it was predicted whole (0: rejected before that)."""
    need: int = 0
    """Bytes per GPU it needs, where it was predicted whole (0: rejected before that)."""


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    ranked: tuple[Prediction, ...]
    """Strategies that fit, fastest first."""
    rejected: tuple[Rejected, ...] = field(default_factory=tuple)
    batch: int
    epoch_samples: int
    peak: PeakRate | None = None
    """One GPU's dense bf16 matrix rate, which MFU divides by (None: CPU ranks, or a GPU
    without a measured rate)."""
    skipped: int = 0
    """Strategies left unpriced: their lower bound is above the `kept`-th best step (and
    cannot change the best of their family or the close calls; planning.recommend.search)."""
    kept: int = 0
    """The fastest strategies ranked exactly as every strategy priced would rank them (0:
    every strategy was priced)."""

    @property
    def best(self) -> Prediction:
        return self.ranked[0]

    def epoch_time(self, pred: Prediction) -> float:
        return self.epoch_samples / pred.samples_per_second if pred.samples_per_second else 0.0

    def mfu(self, pred: Prediction) -> float | None:
        """Model FLOPs utilisation: model FLOPs per step / step time / (GPUs x the peak);
        None where the FLOPs were not counted or the peak is unknown."""
        if self.peak is None or not pred.flops_per_gpu:
            return None
        return pred.flops_per_gpu / self.peak.flops

    def reason(self) -> str:
        text = explain(self.best, self.ranked)
        rivals = self.close_calls()[1:]
        if rivals:
            text += (
                f". Within error of it: {quoted([p.strategy.label() for p in rivals])}; "
                "--validate auto decides by measurement"
            )
        return text

    def close_calls(self, limit: int = 4) -> tuple[Prediction, ...]:
        """The best and every strategy that may really be faster than it: its fastest likely
        measurement is no slower than the best's slowest (Prediction.measured_range). Only
        measurement can order these."""
        ceiling = self.best.measured_range[1]
        close = [p for p in self.ranked if p.measured_range[0] <= ceiling]
        return tuple(close[:limit])


def recommend(
    profile: Profile,
    cluster: Cluster,
    batch: int,
    *,
    gpus: int | None = None,
    optimizer: Optimizer = "sgd",
    memory_margin: float = 0.1,
    epoch_samples: int = 0,
    methods: tuple[str, ...] = ("balanced",),
    schedules: tuple[str, ...] | None = None,
    cuda_graphs: bool | None = None,
    serving: bool = False,
    variants: Sequence[Profile] = (),
    keep: int | None = None,
) -> Recommendation:
    """Rank every strategy on up to `gpus` GPUs (default: the whole cluster), as the runtime
    runs them: on GPUs (a GPU's profile) with every action replayed as a CUDA graph, and one
    device eagerly too (where graphs buy it nothing, their pool only costs memory); on CPU
    ranks eagerly; `cuda_graphs` True or False insists on one or the other. `serving`:
    the fastest way to run inference on `batch` samples (forward only). `variants`:
    profiles of the same model run otherwise (compiled, channels-last, Float8:
    Profile.execution); every strategy is ranked as each runs it too, priced from it.
    `keep`: price only what can change the `keep` fastest, the fastest of each family and
    the close calls, in rising order of a lower bound (planning.recommend.search), and
    count the rest in Recommendation.skipped (None: price every strategy)."""
    both = cuda_graphs is None and profile.device != "cpu"
    if cuda_graphs is None:
        cuda_graphs = profile.device != "cpu"
    priced = {p.execution: p for p in (profile, *variants)}
    gpus = gpus or cluster.world
    if gpus > cluster.world:
        raise ConfigError(
            f"{gpus} GPUs requested but the cluster has {cluster.world}: ask for {cluster.world} "
            "or fewer, or give a cluster with more"
        )
    if batch < 1:
        raise ConfigError(f"batch must be at least 1, got {batch}")
    check_margin(memory_margin)
    check_methods(methods)
    kwargs: dict[str, object] = {"schedules": schedules} if schedules else {}
    if serving:
        kwargs = {"serving": True}
    fits: list[Prediction] = []
    rejected: list[Rejected] = []
    without_recompute: set[Strategy] = set()
    tried: set[Strategy] = set()  # offloaded strategies predicted so far
    accumulated: set[tuple[object, ...]] = set()  # one GPU or data parallel

    def finish(skipped: int = 0, kept: int = 0) -> Recommendation:
        """What fits, fastest first (Search's count of the strategies it skipped, and what
        it kept exact)."""
        # the offloaded forms screened out, which the search drops as it drops those it
        # could not price, are rejected for their memory as those it simulated are
        listed = {r.strategy for r in rejected}
        rejected.extend(
            Rejected(strategy=s, reason=why) for s, why in screened.items() if s not in listed
        )
        if not fits:
            exact = {s: too_large(predicted(s, screen=False)) for s in screened}
            rejected[:] = [exact.pop(r.strategy, r) for r in rejected]
            raise ConfigError(
                nothing_fits(
                    rejected, gpus, cluster, cpu=profile.device == "cpu", margin=memory_margin
                )
            )
        return Recommendation(
            ranked=exposed_first(fastest_first(fits), kept),
            rejected=tuple(rejected),
            batch=batch,
            epoch_samples=epoch_samples,
            peak=peak_rate(cluster, profile.device),
            skipped=skipped,
            kept=kept,
        )

    screened: dict[Strategy, str] = {}
    """Rejected by predict's screen, not simulated: simulated after all where nothing fits,
    for the message's closest strategy and its need."""

    def predicted(s: Strategy, screen: bool = True) -> Prediction:
        by = priced[s.execution]
        try:
            return predict(
                by, cluster, s, batch, optimizer=optimizer, memory_margin=memory_margin,
                exposed=False, screen=screen,
            )  # fmt: skip
        except OverMemory as exc:
            screened[s] = str(exc)
            raise

    if not serving:
        kwargs["tensor_parallel"] = tuple(profile.tensor_parallel)
        kwargs["weight_batches"] = WEIGHT_BATCHES if batches_weights(profile) else (1,)
        kwargs["shard_optimizer"] = OPTIMIZER_STATE[optimizer] > 0  # SGD has none to shard
        kwargs["context_parallel"] = context_degrees(profile, gpus)
        kwargs["shares"] = profile.shares
    todo = strategies(gpus, batch, blocks=profile.num_blocks, methods=methods, **kwargs)  # type: ignore[arg-type]
    hosts = profile.device != "cpu"  # CPU ranks' memory is the host's already
    if keep is not None:
        bounds = Bounds(cluster, batch)
        limit = int(cluster.memory_bytes * (1 - memory_margin))
        rules = Rules(
            price=predicted,
            offloaded=lambda s: offloaded(s, optimizer) if hosts and _plain(s) else [],
            bound=lambda s: bounds.step(priced[s.execution], s),
            too_large=lambda s: _too_large(bounds.memory(priced[s.execution], s, optimizer), limit),
            family=family,
            accumulation=_whole,
            slack=1 + max(high for _, high in (*ERROR_RANGE.values(), CPU_ERROR_RANGE)),
            close=lambda p, best: p.measured_range[0] <= best.measured_range[1],
        )
        if serving:
            rules = replace(rules, offloaded=lambda s: [])
        items = list(_as_run(todo, cuda_graphs, both, list(priced)))
        outcome, skipped = Search(items, rules, keep).run()
        for p in outcome:
            if p.dropped:
                continue
            if p.prediction is None:
                rejected.append(Rejected(strategy=p.strategy, reason=p.error))
            elif p.prediction.fits:
                fits.append(p.prediction)
            else:
                rejected.append(too_large(p.prediction))
        return finish(skipped, keep)
    for strategy in _as_run(todo, cuda_graphs, both, list(priced)):
        base = Strategy(**{**strategy.to_dict(), "recompute": "none"})
        if strategy.recompute != "none" and base in without_recompute:
            continue  # recomputation only where it is needed to fit
        whole = _whole(strategy)
        if strategy.microbatches > ACCUMULATION and whole in accumulated:
            continue  # more accumulation only where fewer micro-batches did not fit

        try:
            pred: Prediction | None = predicted(strategy)
        except PipecastError as exc:
            rejected.append(Rejected(strategy=strategy, reason=str(exc).splitlines()[0]))
            pred = None
        if (pred is None or not pred.fits) and not serving and _plain(strategy) and hosts:
            # what does not fit (or finds no split that fits) may, with its saved
            # activations, optimizer or weights on the host, eagerly; each ranked by its
            # prediction (streamed weights come in beside the compute, and their plans
            # need the least memory, so with the host's step beside the backward they can
            # beat a lighter offload that must cut the batch into more micro-batches)
            hosted = []
            for moved in offloaded(strategy, optimizer):
                if moved in tried:  # streamed and recomputed: from either base
                    continue
                tried.add(moved)
                with contextlib.suppress(PipecastError):
                    other = predicted(moved)
                    if other.fits:
                        hosted.append(other)
                    else:
                        rejected.append(too_large(other))
            fits += hosted
        if pred is None:
            continue
        if pred.fits:
            fits.append(pred)
            if strategy.recompute == "none":
                without_recompute.add(strategy)
                if strategy.kind in ("single", "data"):  # (recomputing is not the only way)
                    accumulated.add(whole)
        else:
            rejected.append(too_large(pred))
    return finish()


def exposed_first(ranked: Sequence[Prediction], kept: int) -> tuple[Prediction, ...]:
    """`ranked` with the communication each of the first `kept` exposes simulated (0: of
    all); the rest simulate theirs when asked (Prediction.exposed_comm)."""
    shown = kept or len(ranked)
    return tuple(with_exposed(p) if i < shown else p for i, p in enumerate(ranked))


def _too_large(least: int, limit: int) -> str:
    """Why a strategy needing at least `least` bytes a GPU cannot fit `limit` ('': it may)."""
    if least <= limit:
        return ""
    return (
        f"needs over {human_bytes(least)} per GPU (a lower bound: weights, gradients, "
        f"optimizer state, one micro-batch's activations), {human_bytes(limit)} usable"
    )


def _whole(s: Strategy) -> tuple[object, ...]:
    """What a strategy accumulating more micro-batches shares with its smaller counts."""
    return (s.kind, s.replicas, s.cuda_graphs, s.shard, s.shard_optimizer, s.tp, s.execution)


def _plain(s: Strategy) -> bool:
    """Whole copies of the weights, whose offloaded forms are tried where it does not fit
    (not a split sequence: the runtime moves nothing of one)."""
    return s.shard == "none" and s.tp == 1 and not s.shard_optimizer and s.cp == 1


def too_large(pred: Prediction) -> Rejected:
    """`pred` rejected for its memory: what it needs against what is usable."""
    need, have = human_bytes(pred.peak_memory), human_bytes(pred.memory_limit)
    return Rejected(
        strategy=pred.strategy,
        reason=f"needs {need} {per_rank(pred.cpu)}, {have} usable",
        short=pred.peak_memory - pred.memory_limit,
        need=pred.peak_memory,
    )


def _as_run(
    todo: Iterable[Strategy],
    cuda_graphs: bool,
    both: bool,
    executions: list[tuple[Compile, bool, bool]],
) -> Iterator[Strategy]:
    """Each strategy as the runtime would run it (graphed where `cuda_graphs`; one device
    eagerly as well where `both`), once per way of running the blocks in `executions`."""
    runs = graphed(iter(todo)) if cuda_graphs else iter(todo)
    for strategy in runs:
        forms = [strategy]
        if both and strategy.kind == "single" and strategy.cuda_graphs:
            forms.append(replace(strategy, cuda_graphs=False))
        for form in forms:
            for compile_, channels_last, float8 in executions:
                yield replace(form, compile=compile_, channels_last=channels_last, float8=float8)


def fastest_first(predictions: Iterable[Prediction]) -> tuple[Prediction, ...]:
    """`predictions` by step time, and at equal step time the one on fewer GPUs first (it
    leaves the others free for the same speed), then the one moving less to the host (a
    copy priced as hidden may still take the link from something else)."""
    return tuple(
        sorted(
            predictions,
            key=lambda p: (p.step_time, p.strategy.gpus, OFFLOADS.index(p.strategy.offload)),
        )
    )


def offloaded(strategy: Strategy, optimizer: Optimizer) -> list[Strategy]:
    """`strategy` with its activations, its optimizer's state (where it has some), or both
    on the host (a strategy that recomputes every micro-batch moves only its checkpoints'
    inputs); and, where the updates are synchronous, with its weights streamed from the host
    too: with its activations or without, and recomputed (the least memory: each block's
    weights on the device only while it runs, one block's activations at a time, and with
    the activations offloaded, the blocks' inputs on the host). A step that copies
    activations or weights runs eagerly."""
    pipedream = strategy.schedule == "pipedream"

    def streams(recompute: str) -> bool:
        return why_not_streamed("weights", recompute, pipedream, strategy.compile) is None

    eager = replace(strategy, cuda_graphs=False)
    state = [replace(strategy, offload="optimizer")] if OPTIMIZER_STATE[optimizer] else []
    if strategy.recompute == "all":  # what waits for the backward: checkpoints' inputs
        moved = [replace(eager, offload="both")] if state else []
        if streams("all"):
            moved += [replace(eager, offload=o) for o in ("weights", "all")]
        return state + moved
    out = [replace(eager, offload="activations")]
    if state:
        out += [*state, replace(eager, offload="both")]
    if streams(strategy.recompute):
        out += [replace(eager, offload=o) for o in ("weights", "all")]
    if strategy.recompute == "none" and streams("all"):
        out += [replace(eager, offload=o, recompute="all") for o in ("weights", "all")]
    return out


def nothing_fits(
    rejected: list[Rejected],
    gpus: int,
    cluster: Cluster,
    *,
    cpu: bool = False,
    margin: float = 0.1,
) -> str:
    """Why no strategy fits, naming the one closest to fitting, offloaded or not: how much
    memory it lacks, its need in bytes and the smallest memory it fits (else the first
    rejected one and its reason). `cpu`: the ranks are CPU processes, whose memory is the
    host's; `margin`: the share of memory kept free."""
    if not rejected:
        return "no strategy to evaluate"
    ranks = f"{gpus} CPU rank(s) with" if cpu else f"{gpus} GPU(s) of"
    head = f"no strategy fits on {ranks} {human_bytes(cluster.memory_bytes)} each"
    fix = f"use more {'ranks' if cpu else 'GPUs'}, a smaller batch, or a smaller model"
    measured = [r for r in rejected if r.short > 0]
    if not measured:
        first = rejected[0]
        return f"{head} (e.g. {first.strategy.label()}: {first.reason}): {fix}"
    closest = min(measured, key=lambda r: r.short)
    text = (
        f"{head}: the closest, {closest.strategy.label()}, {closest.reason}, "
        f"{human_bytes(closest.short)} short"
    )
    if closest.need:
        enough = human_bytes(math.ceil(closest.need / (1.0 - margin)))
        text += f" ({closest.need:,} bytes; it fits {'ranks' if cpu else 'GPUs'} of {enough})"
    return f"{text}: {fix}"


def samples_rate(per_second: float) -> str:
    """Samples a second to the digits that mean something: whole samples from 100 up
    (9,733), a tenth below (48.1)."""
    return f"{per_second:,.0f}" if per_second >= 100 else f"{per_second:,.1f}"


def quoted(labels: list[str]) -> str:
    """Strategy labels as one phrase a reader can split: each label may hold commas of its
    own ("zb-h1 2 stages, M=2, balanced"), so each is quoted and the last joined by "and"."""
    names = [f'"{label}"' for label in labels]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def family(strategy: Strategy) -> str:
    """The kind of strategy a reader compares: one device, data parallel (whole copies),
    sharded (FSDP), tensor parallel, context parallel, or pipeline (with replicas or not)."""
    if strategy.cp > 1:
        return "context parallel"
    if strategy.tp > 1:
        return "tensor parallel"
    if strategy.sharded and strategy.stages == 1:
        return "sharded"
    return "pipeline" if strategy.kind == "hybrid" else strategy.kind


def explain(best: Prediction, ranked: tuple[Prediction, ...]) -> str:
    """One line: why the winner wins, against the best of each other kind."""
    others = {}
    own = family(best.strategy)
    for pred in ranked[1:]:
        kind = family(pred.strategy)
        if kind != own and kind not in others:
            others[kind] = pred
    fastest, slowest = best.measured_range
    parts = [
        f"{best.strategy.label()} is predicted fastest at "
        f"{samples_rate(best.samples_per_second)} samples/s (a run likely measures "
        f"{samples_rate(best.batch / slowest)}-{samples_rate(best.batch / fastest)})"
    ]
    for pred in others.values():
        parts.append(
            f"{best.step_time and pred.step_time / best.step_time:.2f}x faster than "
            f"{pred.strategy.label()}"
        )
    t = best.timeline
    detail = []
    if best.strategy.stages > 1:
        detail.append(f"bubble {t.bubble_fraction:.0%}")
    if best.exposed_comm > 0:
        detail.append(f"exposed communication {best.comm_fraction:.0%}")
    if best.host_memory:
        detail.append(f"{human_bytes(best.host_memory)} of the host's memory, pinned")
    if best.host_bound:
        detail.append(
            f"host-bound: the host issues work {t.host_share:.0%} of the step, so expect a "
            "larger error; --validate measures it"
        )
    text = "; ".join(parts)
    return text + (f" ({', '.join(detail)})" if detail else "")
