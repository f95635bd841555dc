"""Branch and bound over recommend's strategies: price them in rising order of a lower bound
on their step (planning.recommend.bound) and leave unpriced those whose bound shows they
cannot change what a reader is shown.

What is shown, and so kept exact: the `keep` fastest strategies; the fastest of each
family (the recommendation's reason compares the winner with each); and the close calls
(Recommendation.close_calls: the first four whose fastest likely measurement is no slower
than the best's slowest). A strategy is left unpriced only where its bound is above the
keep-th best step so far and above its family's best so far (phase one; both only fall as
more is priced, so a strategy left out stays out), and then, with the best known, above
what could make it one of the first four close calls (phase two). The ranking that results
holds every strategy the exhaustive search ranks at or below the keep-th best step, in the
same order, and the same best of each family and close calls; the strategies left out are
counted, never silently dropped.

The rules of the exhaustive loop are kept: a recomputed strategy is priced only where its
twin without recomputation does not fit, more accumulation than ACCUMULATION only where no
smaller count of the same single-device or data-parallel strategy fits, and a strategy's
offloaded forms only where it does not fit. Each of these asks whether another strategy
fits: that one is priced first, whatever its bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

from pipecast.errors import PipecastError
from pipecast.planning.recommend.enumerate import ACCUMULATION
from pipecast.planning.recommend.predict import Prediction
from pipecast.values.strategy import Strategy


@dataclass(frozen=True)
class Priced:
    """One strategy priced: its prediction, or the first line of why it could not be."""

    order: tuple[int, int]
    """(its place in the enumeration, 0) or, for an offloaded form, (its base's, k + 1):
    the exhaustive loop's order, which breaks ties between equal steps."""
    strategy: Strategy
    prediction: Prediction | None
    error: str = ""
    """Why it could not be priced (a Rejected's reason)."""
    dropped: bool = False
    """Not priced, as the exhaustive loop leaves it out (its rules above), or an offloaded
    form that could not be priced, which that loop drops too: listed nowhere."""


Entry = tuple[float, tuple[int, int], int, "Strategy | None"]
"""A strategy waiting to be priced: (its bound, its order, its place in the enumeration or
its base's, the offloaded form itself or None for the enumerated strategy)."""


@dataclass(frozen=True)
class Rules:
    """What the search needs from recommend: how to price, bound and group strategies."""

    price: Callable[[Strategy], Prediction]
    """Predict one strategy (raises PipecastError where it cannot be)."""
    offloaded: Callable[[Strategy], list[Strategy]]
    """The offloaded forms to try where the strategy does not fit (none: empty)."""
    bound: Callable[[Strategy], float]
    too_large: Callable[[Strategy], str]
    """Why a strategy cannot fit, from a lower bound on its memory ('': it may)."""
    family: Callable[[Strategy], str]
    accumulation: Callable[[Strategy], Hashable | None]
    """The group whose smaller accumulation counts gate larger ones (None: no group)."""
    slack: float
    """The most a close call's step may exceed the best's slowest likely measurement
    (1 + the largest 'high' of the error ranges)."""
    close: Callable[[Prediction, Prediction], bool]
    """Whether the first is a close call of the second, the best."""


class Search:
    def __init__(self, items: Sequence[Strategy], rules: Rules, keep: int) -> None:
        self.items, self.rules, self.keep = list(items), rules, max(keep, 1)
        self.index: dict[Strategy, int] = {}
        for i, s in enumerate(self.items):
            self.index.setdefault(s, i)
        self.groups: dict[Hashable, list[int]] = {}
        for i, s in enumerate(self.items):  # gated by plain fits (recomputing is one way)
            plain = s.recompute == "none"
            if s.kind in ("single", "data") and plain and (g := rules.accumulation(s)) is not None:
                self.groups.setdefault(g, []).append(i)
        self.first_fit: dict[Hashable, int | None] = {}
        self.walked: dict[Hashable, int] = {}
        self.priced: dict[int, Priced] = {}
        self.hosted: dict[Strategy, Priced] = {}
        self.best_k: list[float] = []  # the keep fastest steps so far, negated (a max-heap)
        self.family_best: dict[str, float] = {}
        self.bounds = [rules.bound(s) for s in self.items]
        self.queue: list[Entry] = []

    # ---- the outcome ----------------------------------------------------------------

    def run(self) -> tuple[list[Priced], int]:
        """Every strategy priced (with its offloaded forms), and how many were left out."""
        self.queue = [(self.bounds[i], (i, 0), i, None) for i in range(len(self.items))]
        heapq.heapify(self.queue)
        left = self._drain(self._threshold)
        best = self._best()
        if best is not None:  # phase two: the close calls, the best now known
            self.queue = left
            heapq.heapify(self.queue)
            left = self._drain(self._close_limit(best))
        items = {i for _, _, i, form in left if form is None and i not in self.priced}
        forms = {form for _, _, _, form in left if form is not None and form not in self.hosted}
        outcome = [*self.priced.values(), *self.hosted.values()]
        return sorted(outcome, key=lambda p: p.order), len(items) + len(forms)

    def _drain(self, limit: Callable[[Strategy], float]) -> list[Entry]:
        """Price the queue's entries in rising order of bound while each is within
        `limit` of its strategy (a limit that only falls as more is priced); the rest, left
        out."""
        left = []
        while self.queue:
            entry = heapq.heappop(self.queue)
            bound, order, i, form = entry
            s = self.items[i] if form is None else form
            if bound > limit(s):
                left.append(entry)
            elif form is None:
                self._ensure(i)
            else:
                self._host(form, order)
        return left

    def _best(self) -> Prediction | None:
        fits = self._fits()
        return min(fits, key=lambda p: p.step_time) if fits else None

    def _fits(self) -> list[Prediction]:
        return [
            p.prediction
            for p in (*self.priced.values(), *self.hosted.values())
            if p.prediction is not None and p.prediction.fits
        ]

    # ---- phase one: the keep fastest and each family's fastest -------------------------

    def _threshold(self, s: Strategy) -> float:
        kth = -self.best_k[0] if len(self.best_k) >= self.keep else float("inf")
        return max(kth, self.family_best.get(self.rules.family(s), float("inf")))

    # ---- phase two: the close calls ---------------------------------------------------

    def _close_limit(self, best: Prediction) -> Callable[[Strategy], float]:
        """What a strategy's step must not exceed to be one of the first four close calls:
        the best is final, so whether a priced strategy is a close call is too, and the
        fourth one's step only falls."""
        ceiling = best.measured_range[1] * self.rules.slack
        seen = [-1, ceiling]

        def limit(_: Strategy) -> float:
            priced = len(self.priced) + len(self.hosted)
            if priced != seen[0]:
                close = sorted(p.step_time for p in self._fits() if self.rules.close(p, best))
                seen[:] = [priced, min(ceiling, close[3]) if len(close) >= 4 else ceiling]
            return seen[1]

        return limit

    # ---- pricing with the exhaustive loop's rules --------------------------------------

    def _ensure(self, i: int) -> None:
        """Strategy `i` priced where the exhaustive loop prices it (recorded either way);
        where it does not fit, its offloaded forms queued, each at its own bound (no less
        than its base's: moving to the host adds time)."""
        if i in self.priced:
            return
        s = self.items[i]
        if not self._eligible(i):
            self.priced[i] = Priced((i, 0), s, None, dropped=True)
            return
        error = self.rules.too_large(s)
        pred: Prediction | None = None
        if not error:
            try:
                pred = self.rules.price(s)
            except PipecastError as exc:
                error = str(exc).splitlines()[0]
        self.priced[i] = Priced((i, 0), s, pred, error)
        if pred is None or not pred.fits:
            for k, moved in enumerate(self.rules.offloaded(s)):
                bound = max(self.rules.bound(moved), self.bounds[i])
                heapq.heappush(self.queue, (bound, (i, k + 1), i, moved))
        if pred is not None and pred.fits:
            self._count(s, pred)

    def _host(self, moved: Strategy, order: tuple[int, int]) -> None:
        if moved in self.hosted:
            known = self.hosted[moved]
            if order < known.order:
                self.hosted[moved] = replace(known, order=order)
            return
        try:
            pred = self.rules.price(moved)
        except PipecastError:
            self.hosted[moved] = Priced(order, moved, None, dropped=True)
            return
        self.hosted[moved] = Priced(order, moved, pred)
        if pred.fits:
            self._count(moved, pred)

    def _count(self, s: Strategy, pred: Prediction) -> None:
        heapq.heappush(self.best_k, -pred.step_time)
        if len(self.best_k) > self.keep:
            heapq.heappop(self.best_k)
        family = self.rules.family(s)
        self.family_best[family] = min(self.family_best.get(family, pred.step_time), pred.step_time)

    def _fits_at(self, i: int) -> bool:
        self._ensure(i)
        p = self.priced[i].prediction
        return p is not None and p.fits

    def _eligible(self, i: int) -> bool:
        s = self.items[i]
        if s.recompute != "none":
            base = self.index.get(replace(s, recompute="none"))
            if base is not None and base < i and self._fits_at(base):
                return False
        group = self.rules.accumulation(s) if s.kind in ("single", "data") else None
        if s.microbatches > ACCUMULATION and group is not None:
            first = self._first_fit(group, before=i)
            if first is not None and first < i:
                return False
        return True

    def _first_fit(self, group: Hashable, before: int) -> int | None:
        """The first strategy of `group` that fits, looking no further than `before`."""
        if self.first_fit.get(group) is not None:
            return self.first_fit[group]
        members = self.groups.get(group, [])
        while (at := self.walked.get(group, 0)) < len(members) and members[at] < before:
            self.walked[group] = at + 1  # before pricing: that asks about earlier ones
            if self._fits_at(members[at]):
                self.first_fit[group] = members[at]
                break
        return self.first_fit.get(group)
