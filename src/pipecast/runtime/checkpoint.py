"""Training state on disk, so that a run that dies part way resumes where it stopped.

A checkpoint belongs to the model, not to the partition: each stage writes its state dict
(parameters and buffers, such as batch norm's statistics) and its optimizer state under the
blocks' global names (a slice of an nn.Sequential keeps them). A run can therefore resume on
another partition, schedule or number of GPUs, and the state loads straight into the whole
model (`model_state`).

    DIR/step-00000120/stage-003.pt   stage 3's state dict, optimizer state and weight version
    DIR/step-00000120/rank-001.pt    rank 1's random-number generators
    DIR/step-00000120/meta.json      written last, once every other file is in place

A step directory without meta.json is one that a run died while writing. Every file is
written with its sha256 (pipecast.runtime.digests), and meta.json lists each file's digest and
size, so a file cut short or damaged later is found before anything loads it. Resuming takes
the newest intact checkpoint and names each newer one it passes over, and why (`survey`),
a file named like a step among them; a directory whose every checkpoint is damaged is an
error rather than a silent fresh start, and one of incomplete steps alone a fresh start that
names them.
The next complete checkpoint removes the incomplete ones before it. Under torchrun across
nodes, DIR must be on one file system that every node shares.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipecast.errors import ConfigError
from pipecast.runtime import digests

META = "meta.json"
PREFIX = "step-"


@dataclass(frozen=True)
class Checkpointing:
    """Where and how often a run writes its state, and whether it starts from it."""

    dir: str
    every: int = 0
    """Write after every `every` completed steps (0: only after the last step). A run always
    writes after its last step."""
    keep: int = 2
    """Complete checkpoints kept; older ones are removed once a newer one is complete."""
    resume: bool = False
    """Start from the newest complete checkpoint in `dir` (from scratch when there is none).
    Without it, a `dir` that already holds a checkpoint is an error, not overwritten."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ConfigError(f"checkpoint interval must be 0 or more steps, got {self.every}")
        if self.keep < 1:
            raise ConfigError(f"keep at least 1 checkpoint, got {self.keep}")

    def due(self, done: int, total: int) -> bool:
        """Whether to write after `done` of `total` steps have completed."""
        return done == total or (self.every > 0 and done % self.every == 0)


@dataclass(frozen=True)
class Saved:
    """One complete checkpoint: its directory and what meta.json says of it."""

    path: Path
    meta: dict[str, Any]
    passed_over: tuple[str, ...] = ()
    """The newer checkpoints that were not intact, one line each: which and why."""

    @property
    def step(self) -> int:
        """Steps completed when it was written."""
        return int(self.meta["step"])

    def stage_files(self, start: int, stop: int) -> list[Path]:
        """The stage files holding any of the blocks start..stop-1."""
        return [
            self.path / name
            for name, (a, b) in self.meta["stage_blocks"].items()
            if a < stop and start < b
        ]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def _steps(root: Path) -> list[tuple[int, Path]]:
    """Every entry of `root` named like a step's directory, in step order (a file so named
    too: `_inspect` names it)."""
    out = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit():
                out.append((int(p.name[len(PREFIX) :]), p))
    return sorted(out)


INCOMPLETE = f"is incomplete (no {META}: a run stopped while writing it)"
STRAY = "is not a directory, so not a checkpoint (a file named like one)"
NOT_CHECKPOINTS = (INCOMPLETE, STRAY)
"""Why a step is passed over that says nothing was damaged: where every step is one of
these, a resume starts from scratch (and says so) rather than stopping."""


def _inspect(path: Path) -> tuple[dict[str, Any], str | None]:
    """The checkpoint in `path`: its meta.json, and why it cannot be resumed from (None: it
    is intact): not a directory, no meta.json, one that does not parse (or is not UTF-8
    text), a stage file missing, or a file of another size or sha256 than when it was
    written. Says how it would read after "checkpoint PATH"."""
    if not path.is_dir():
        return {}, STRAY
    try:
        raw = (path / META).read_bytes()
    except FileNotFoundError:
        return {}, INCOMPLETE
    except OSError as exc:
        return {}, f"has a {META} that cannot be read ({exc.strerror})"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return {}, (
            f"has a damaged {META} ({len(raw)} bytes, byte {raw[exc.start]:#04x} at offset "
            f"{exc.start} is not UTF-8 text)"
        )
    try:
        meta = json.loads(text)
        int(meta["step"])
        names = [str(n) for n in meta["stage_blocks"]]
        listed = meta.get("files", {})  # none in a checkpoint from before digests
        files = {str(n): (str(f["sha256"]), int(f["bytes"])) for n, f in listed.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, f"has a damaged {META} ({len(text)} bytes, not a checkpoint's: cut short?)"
    for name in names:
        if not (path / name).is_file():
            return meta, f"lacks {name}"
    for name, (sha, size) in files.items():
        if not (path / name).is_file():
            continue  # a rank's generators: optional (load_rank), as on another layout
        if (on_disk := (path / name).stat().st_size) != size:
            return meta, f"has {name} cut short or grown: {on_disk} bytes, {size} when written"
        if digests.digest(path / name) != sha:
            return meta, f"has {name} damaged: it does not match the sha256 written with it"
    return meta, None


def survey(root: str | Path) -> tuple[Saved | None, tuple[str, ...]]:
    """The newest intact checkpoint under `root` (None when there is none), and a line for
    each newer step passed over, and why: those it carries as `Saved.passed_over`, or, with
    no checkpoint to resume from, the incomplete steps and stray files a resume starts
    from scratch past. Where there are checkpoints but none intact, a one-line error:
    resuming from scratch would silently throw the run away."""
    passed: list[tuple[str, str]] = []
    for _, path in reversed(_steps(Path(root))):
        meta, why = _inspect(path)
        if why is None:
            lines = tuple(line for line, _ in passed)
            return Saved(path, meta, lines), lines
        passed.append((f"checkpoint {path} {why}", why))
    if any(why not in NOT_CHECKPOINTS for _, why in passed):
        raise ConfigError(
            f"no intact checkpoint in {root}: {'; '.join(line for line, _ in passed)}; "
            "remove them, or write to another directory, to start from scratch"
        )
    return None, tuple(line for line, _ in passed)


def latest(root: str | Path) -> Saved | None:
    """The newest intact checkpoint under `root` (None when there is none), with a line for
    each newer one passed over (`survey`)."""
    return survey(root)[0]


def _begin(root: str | Path, step: int) -> Path:
    """The step's directory, made ready for this rank's files: a meta.json left there by an
    earlier run (one that wrote this step before it died, or a damaged checkpoint resumed
    past) no longer describes it."""
    path = step_dir(root, step)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"{path} is a file where the checkpoint of step {step} goes: move it, or write "
            "checkpoints to another directory"
        )
    path.mkdir(parents=True, exist_ok=True)
    (path / META).unlink(missing_ok=True)
    return path


def stage_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, version: int
) -> dict[str, Any]:
    """A stage's state dict and optimizer state, keyed by global names, on the CPU."""
    params = {n: t.detach().cpu().clone() for n, t in module.state_dict().items()}
    state: dict[str, dict[str, Any]] = {}
    if optimizer is not None:
        # by position: an optimizer on the host steps copies of the module's parameters
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        flat = [q for group in optimizer.param_groups for q in group["params"]]
        name_of = {id(q): names[i] for i, q in enumerate(flat)}
        for p, s in optimizer.state.items():
            state[name_of[id(p)]] = {
                k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v
                for k, v in s.items()
            }
    return {"model": params, "optimizer": state, "version": version}


def write_stage(root: str | Path, step: int, stage: int, state: Mapping[str, Any]) -> None:
    digests.save(dict(state), _begin(root, step) / f"stage-{stage:03d}.pt")


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def write_rank(root: str | Path, step: int, rank: int, device: torch.device) -> None:
    digests.save(rng_state(device), _begin(root, step) / f"rank-{rank:03d}.pt")


def finish(root: str | Path, step: int, meta: Mapping[str, Any], keep: int) -> Path:
    """Mark the checkpoint of `step` complete (every rank has written its files) and remove
    what it supersedes: complete checkpoints beyond the newest `keep`, and every incomplete
    one older than it. meta.json records each file's sha256 and size, as its writer left
    them beside it."""
    path = step_dir(root, step)
    files: dict[str, dict[str, Any]] = {}
    for file in sorted(path.glob("*.pt")):
        sha, size = digests.written(file) or (digests.digest(file), file.stat().st_size)
        files[file.name] = {"sha256": sha, "bytes": size}
    tmp = path / (META + ".tmp")
    tmp.write_text(json.dumps({**meta, "step": step, "files": files}, indent=1))
    os.replace(tmp, path / META)
    for side in path.glob("*" + digests.SUFFIX):
        side.unlink(missing_ok=True)
    complete = 0
    for s, p in reversed(_steps(Path(root))):
        if s > step:
            continue
        if (p / META).exists():
            complete += 1
            if complete <= keep:
                continue
        shutil.rmtree(p, ignore_errors=True)
    return path


def check_resumable(saved: Saved, *, blocks: int, optimizer: str, total: int) -> None:
    """What makes `saved` the wrong state for a run, as a one-line error."""
    where = f"checkpoint {saved.path}"
    if int(saved.meta.get("blocks", -1)) != blocks:
        raise ConfigError(
            f"{where} holds a model of {saved.meta.get('blocks')} blocks, this one has {blocks}"
        )
    if saved.meta.get("optimizer") != optimizer:
        raise ConfigError(
            f"{where} holds {saved.meta.get('optimizer')} optimizer state, this run uses "
            f"{optimizer}: resume with the same optimizer"
        )
    if saved.step >= total:
        raise ConfigError(
            f"{where} has completed {saved.step} steps already, as many as this run asks for "
            f"({total}): ask for more steps"
        )


def load_stage(
    saved: Saved,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    start: int,
    stop: int,
) -> int:
    """Set a stage of blocks start..stop-1 to its state in `saved`, parameters and buffers
    copied in place (into the stage's dtype and device); its weight version."""
    params: dict[str, torch.Tensor] = {}
    state: dict[str, dict[str, Any]] = {}
    versions = []
    for path in saved.stage_files(start, stop):
        part = _load(path)
        params.update(part["model"])
        state.update(part["optimizer"])
        versions.append(int(part["version"]))
    own = module.state_dict()
    missing = [n for n in own if n not in params]
    if missing:
        raise ConfigError(
            f"checkpoint {saved.path} has no {missing[0]!r} ({len(missing)} entries "
            f"missing): was it written by another model?"
        )
    for n, t in own.items():
        if params[n].shape != t.shape:
            raise ConfigError(
                f"checkpoint {saved.path}: {n!r} is {tuple(params[n].shape)} there, "
                f"{tuple(t.shape)} in the model"
            )
    module.load_state_dict({n: params[n] for n in own})
    if optimizer is not None:
        current = optimizer.state_dict()
        order = [n for n, p in module.named_parameters() if p.requires_grad]
        current["state"] = {i: state[n] for i, n in enumerate(order) if n in state}
        optimizer.load_state_dict(current)
    return max(versions, default=0)


def load_rank(saved: Saved, rank: int, device: torch.device) -> bool:
    """Restore `rank`'s random-number generators where the checkpoint has them (False: it
    has none for this rank)."""
    path = saved.path / f"rank-{rank:03d}.pt"
    if not path.exists():
        return False
    rng = _load(path)
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)
    return True


def _load(path: Path) -> Any:
    """torch.load on the CPU; a file it cannot read, a one-line error (a checkpoint written
    before files had digests is checked only here)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0][:160]
        raise ConfigError(
            f"checkpoint file {path} cannot be read ({type(exc).__name__}: {first}): remove "
            f"{path.parent} to resume from the checkpoint before it"
        ) from None


def model_state(root: str | Path, step: int | None = None) -> dict[str, torch.Tensor]:
    """The whole model's state dict from the newest checkpoint under `root` (or from
    `step`): `model.load_state_dict(model_state(dir))`. A damaged newest checkpoint is an
    error naming the newest intact one, not a silent step back."""
    saved = latest(root) if step is None else _at(root, step)
    if saved is None:
        raise ConfigError(f"no complete checkpoint in {root}")
    if saved.passed_over:
        raise ConfigError(
            f"{saved.passed_over[0]}: model_state({str(root)!r}, step={saved.step}) "
            f"gives the newest intact one"
        )
    out: dict[str, torch.Tensor] = {}
    for path in saved.stage_files(0, int(saved.meta["blocks"])):
        out.update(_load(path)["model"])
    return out


def _at(root: str | Path, step: int) -> Saved | None:
    path = step_dir(root, step)
    if not path.is_dir():
        return None
    meta, why = _inspect(path)
    if why is not None:
        raise ConfigError(f"checkpoint {path} {why}")
    return Saved(path, meta)


def discard_incomplete(root: str | Path) -> list[Path]:
    """Remove each step directory under `root` that holds no meta.json, and return them: once
    a run was stopped (its ranks ended while writing, say) and no rank writes there any
    more, `root` holds complete checkpoints only, and nothing half-written that a reader
    could take for one."""
    gone = [path for _, path in _steps(Path(root)) if not (path / META).exists()]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def stage_blocks(bounds: Iterable[tuple[int, int, int]]) -> dict[str, tuple[int, int]]:
    """meta.json's map from stage file to the blocks it holds: (stage, start, stop) each."""
    return {f"stage-{s:03d}.pt": (a, b) for s, a, b in bounds}
