"""Action and Plan: a schedule as data, with a compact text form that round-trips.

An Action is (stage, kind, micro-batch). Its text is `{stage}{kind}{mb}`: `0F3` is stage 0's
forward of micro-batch 3, `2B1` stage 2's input-gradient backward, `2W1` its weight-gradient
backward, `1BW0` a whole backward. A Plan is one ordered action list per pipeline rank, plus
the stage-to-rank placement; communication is implied by the placement. A split-backward plan
may batch its W actions (Plan.weight_batch): the header says `weight-batch=K`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from pipecast import jsonio
from pipecast.errors import PlanError

Kind = Literal["F", "B", "W", "BW"]
KINDS: tuple[Kind, ...] = ("F", "B", "W", "BW")
_TEXT = re.compile(r"^(\d+)(BW|F|B|W)(\d+)$")
FORMAT_VERSION = 1


class Action(NamedTuple):
    """A tuple, so that hashing and comparing one (the simulator does both for every
    dependency it looks up) run in C; ordered by stage, kind, micro-batch."""

    stage: int
    kind: Kind
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _TEXT.match(text.strip())
        if not m:
            raise PlanError(
                f"'{text}' is not an action: write stage, kind, micro-batch (0F3, 2BW1)"
            )
        kind: Kind = m.group(2)  # type: ignore[assignment]
        return cls(int(m.group(1)), kind, int(m.group(3)))

    @property
    def is_backward(self) -> bool:
        return self.kind != "F"


def F(stage: int, mb: int) -> Action:
    return Action(stage, "F", mb)


def B(stage: int, mb: int) -> Action:
    return Action(stage, "B", mb)


def W(stage: int, mb: int) -> Action:
    return Action(stage, "W", mb)


def BW(stage: int, mb: int) -> Action:
    return Action(stage, "BW", mb)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Per-rank ordered actions for one training (or inference) step."""

    name: str
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    """Pipeline rank that runs each stage (interleaved: several stages per rank)."""
    actions: tuple[tuple[Action, ...], ...]
    """actions[rank] in execution order."""
    split_backward: bool = False
    """Backward as B then W (zero-bubble), not BW."""
    forward_only: bool = False
    async_updates: bool = False
    """PipeDream: update weights after every micro-batch's backward, stashing versions."""
    weight_batch: int = 1
    """Split backward: the W of every `weight_batch` consecutive micro-batches of a stage
    runs as one, at the place of the group's last W on its rank (values.plan.weight_groups)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    def stages_of(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def __str__(self) -> str:
        return self.to_text()

    def to_text(self) -> str:
        flags = [
            f
            for f, on in (
                ("split", self.split_backward),
                ("forward-only", self.forward_only),
                ("async", self.async_updates),
            )
            if on
        ]
        head = (
            f"plan {self.name} stages={self.num_stages} microbatches={self.num_microbatches} "
            f"placement={','.join(map(str, self.stage_to_rank))}"
        )
        if flags:
            head += " flags=" + ",".join(flags)
        if self.weight_batch > 1:
            head += f" weight-batch={self.weight_batch}"
        rows = [
            f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in enumerate(self.actions)
        ]
        return "\n".join([head, *rows])

    @classmethod
    def from_text(cls, text: str) -> Plan:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        if not lines or not lines[0].startswith("plan "):
            raise PlanError("a plan's text starts with 'plan NAME stages=S microbatches=M ...'")
        words = lines[0].split()
        fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
        try:
            flags = set(fields.get("flags", "").split(",")) - {""}
            actions = []
            for line in lines[1:]:
                label, _, body = line.partition(":")
                if not label.startswith("rank "):
                    raise PlanError(f"expected 'rank N: actions', got '{line}'")
                actions.append(tuple(Action.parse(t) for t in body.split()))
            return cls(
                name=words[1],
                num_stages=int(fields["stages"]),
                num_microbatches=int(fields["microbatches"]),
                stage_to_rank=tuple(int(x) for x in fields["placement"].split(",")),
                actions=tuple(actions),
                split_backward="split" in flags,
                forward_only="forward-only" in flags,
                async_updates="async" in flags,
                weight_batch=int(fields.get("weight-batch", 1)),
            )
        except (KeyError, ValueError) as exc:
            raise PlanError(f"malformed plan header '{lines[0]}': {exc}") from None

    def to_json(self) -> str:
        return jsonio.dump("plan", FORMAT_VERSION, {"text": self.to_text(), "meta": self.meta})

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Plan:
        doc = jsonio.load("plan", FORMAT_VERSION, text, source)
        plan = cls.from_text(doc["text"])
        return Plan(**{**plan.__dict__, "meta": doc.get("meta", {})})
