"""A pipecast plan in torch.distributed.pipelining's terms, for users of their own stack.

* The split: `split_spec` for `torch.distributed.pipelining.pipeline`, one
  `SplitPoint.BEGINNING` at the module each stage past the first starts with.
* The schedule: one CSV row of actions per rank, in torch's text form, which
  `PipelineScheduleMulti._load_csv` reads. pipecast's kinds map to torch's: F -> F, B (the
  input gradient alone) -> I, W -> W, BW (both) -> B.

Only a plan torch runs the same way is exported. Its loader wants a backward for every
micro-batch's forward, so a forward-only plan is refused there; and its schedules step the
optimizer once per batch, so a PipeDream plan's updates after every micro-batch (weight
stashing) would load as plain 1F1B, the asynchrony silently gone. Both are refused here.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipecast.errors import ConfigError
from pipecast.values.plan.action import Action, Plan

TORCH_KIND = {"F": "F", "B": "I", "W": "W", "BW": "B"}


def why_not_exported(plan: Plan) -> str | None:
    """None if torch.distributed.pipelining runs `plan` as pipecast does, else why not."""
    if plan.forward_only:
        return (
            f"{plan.name} has no backward, and torch's schedule loader wants one for every "
            "micro-batch's forward: export a training schedule (e.g. 1f1b)"
        )
    if plan.async_updates:
        return (
            f"{plan.name} updates the weights after every micro-batch (weight stashing); "
            "torch's schedules step once per batch, so the CSV would run as 1F1B: export "
            "1f1b for that schedule"
        )
    return None


def check_exported(plan: Plan) -> None:
    why = why_not_exported(plan)
    if why:
        raise ConfigError(f"--export torch: {why}")


def torch_action(action: Action) -> str:
    return f"{action.stage}{TORCH_KIND[action.kind]}{action.mb}"


def schedule_csv(plan: Plan) -> str:
    """One line per rank: its actions in torch's text form, comma-separated (a ConfigError
    for a plan torch would not run the same way)."""
    check_exported(plan)
    return "".join(",".join(torch_action(a) for a in acts) + "\n" for acts in plan.actions)


def split_points(begins: Sequence[str], boundaries: Sequence[int]) -> list[str]:
    """The module names at which stages 1.. begin (`begins[b]`: block b's)."""
    out = []
    for b in boundaries[1:-1]:
        if not begins[b]:
            raise ConfigError(
                f"block {b} does not begin at a module's start, so no SplitPoint marks it"
            )
        out.append(begins[b])
    return out


def split_script(model: str, points: Sequence[str], plan: Plan, csv_name: str) -> str:
    """A Python snippet a torch.distributed.pipelining user pastes into their script."""
    spec = "".join(f"    {p!r}: SplitPoint.BEGINNING,\n" for p in points)
    return (
        f"# pipecast's split of {model}: {len(points) + 1} stages, schedule {plan.name}, "
        f"{plan.num_microbatches} micro-batches\n"
        "from torch.distributed.pipelining import SplitPoint\n\n"
        f"split_spec = {{\n{spec}}}\n"
        f"# pipe = torch.distributed.pipelining.pipeline(model, mb_args=(x,), "
        f"split_spec=split_spec)\n"
        f"# schedule._load_csv({csv_name!r})  # a PipelineScheduleMulti, "
        f"{plan.num_ranks} ranks\n"
    )
