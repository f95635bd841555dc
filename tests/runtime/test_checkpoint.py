"""A run that dies part way resumes where it stopped, with the weights and optimizer state an
uninterrupted run has (pipecast.runtime.checkpoint)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from tests.runtime.helpers import assert_close, fault, merged, pipeline_job, run
from torch import nn

from pipecast.errors import ConfigError
from pipecast.runtime import checkpoint
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import RankLost
from pipecast.runtime.run import _tell_passed_over, run_job
from pipecast.runtime.worker import StepProgress
from pipecast.values.models import Workload
from pipecast.values.plan.grid import render_grid

LENET = Workload(model="lenet5", dataset="mnist")  # 12 blocks, no batch norm, no dropout


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 3)
    )


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(seed + step)
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _write(
    root: Path, step: int, stages: list[tuple[nn.Module, torch.optim.Optimizer, int, int]]
) -> None:
    for i, (module, opt, _, _) in enumerate(stages):
        checkpoint.write_stage(root, step, i, checkpoint.stage_state(module, opt, step))
    meta = {
        "blocks": 5,
        "optimizer": "adam",
        "stage_blocks": checkpoint.stage_blocks((i, a, b) for i, (_, _, a, b) in enumerate(stages)),
    }
    checkpoint.finish(root, step, meta, keep=2)


def test_a_checkpoint_of_two_stages_resumes_as_one_stage(tmp_path: Path) -> None:
    """Parameters, batch-norm statistics and Adam's state, written by two stages under their
    global names, loaded into one stage that holds every block: the next steps equal those of
    a model that never stopped."""
    whole = _model()
    opt = torch.optim.Adam(whole.parameters(), lr=0.01)
    _train(whole, opt, 3, seed=0)
    front, back = whole[:2], whole[2:]
    opts = [
        torch.optim.Adam(front.parameters(), lr=0.01),
        torch.optim.Adam(back.parameters(), lr=0.01),
    ]
    for o in opts:  # the same state, split by stage
        for p in o.param_groups[0]["params"]:
            o.state[p] = opt.state[p]
    _write(tmp_path, 3, [(front, opts[0], 0, 2), (back, opts[1], 2, 5)])

    fresh = _model()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    saved = checkpoint.latest(tmp_path)
    assert saved is not None and saved.step == 3
    assert checkpoint.load_stage(saved, fresh, fresh_opt, 0, 5) == 3
    at_three = _state(whole)
    _equal(_state(fresh), at_three)
    _equal(checkpoint.model_state(tmp_path), at_three)
    _train(whole, opt, 2, seed=3)
    _train(fresh, fresh_opt, 2, seed=3)
    _equal(_state(fresh), _state(whole))


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_only_complete_checkpoints_count_and_old_ones_go(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, 1, seed=0)
    for step in (1, 2, 3):
        _write(tmp_path, step, [(model, opt, 0, 5)])
    # a run that died writing step 4: its files, no meta.json
    checkpoint.write_stage(tmp_path, 4, 0, checkpoint.stage_state(model, opt, 4))
    saved = checkpoint.latest(tmp_path)
    assert saved is not None and saved.step == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000002",
        "step-00000003",
        "step-00000004",
    ]
    _write(tmp_path, 5, [(model, opt, 0, 5)])  # keeps 2 complete, drops the dead one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000005"]


def _damage(file: Path) -> None:
    """Random bytes over the middle of `file`, its size unchanged (a bad disk block)."""
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.seek(size // 2)
        f.write(bytes(range(7, 71)))


def test_a_damaged_checkpoint_is_named_and_the_one_before_it_used(tmp_path: Path) -> None:
    """Each file's sha256 goes into meta.json: a stage file damaged in place, a meta.json cut
    short or a file cut short or gone is passed over, with a line naming it and why, for
    the newest intact checkpoint; none intact is an error, not a silent fresh start."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _write(tmp_path, 1, [(model, opt, 0, 2), (model, opt, 2, 5)])
    _write(tmp_path, 2, [(model, opt, 0, 2), (model, opt, 2, 5)])
    newest = tmp_path / "step-00000002"
    meta = json.loads((newest / "meta.json").read_text())
    stage = newest / "stage-001.pt"
    assert meta["files"]["stage-001.pt"] == {
        "sha256": hashlib.sha256(stage.read_bytes()).hexdigest(),
        "bytes": stage.stat().st_size,
    }
    assert sorted(p.name for p in newest.iterdir()) == ["meta.json", "stage-000.pt", "stage-001.pt"]
    pristine = stage.read_bytes()
    damages = {
        "has stage-001.pt damaged: it does not match the sha256": lambda: _damage(stage),
        "has a damaged meta.json": lambda: (newest / "meta.json").write_text(
            (newest / "meta.json").read_text()[:40]
        ),
        "has stage-001.pt cut short or grown": lambda: stage.write_bytes(pristine[:-100]),
        "lacks stage-001.pt": stage.unlink,
    }
    for why, damage in damages.items():
        _write(tmp_path, 2, [(model, opt, 0, 2), (model, opt, 2, 5)])
        damage()
        saved = checkpoint.latest(tmp_path)
        assert saved is not None and saved.step == 1, why
        (line,) = saved.passed_over
        assert line.startswith(f"checkpoint {newest} {why}"), line
        with pytest.raises(ConfigError, match=re.escape("step=1) gives the newest intact")):
            checkpoint.model_state(tmp_path)
        with pytest.raises(ConfigError, match=re.escape(why)):
            checkpoint.model_state(tmp_path, step=2)
    _damage(tmp_path / "step-00000001" / "stage-000.pt")
    with pytest.raises(ConfigError, match=r"no intact checkpoint in .*remove them"):
        checkpoint.latest(tmp_path)
    # a stage file torch cannot read, in a checkpoint from before digests: one line, no traceback
    legacy = checkpoint.Saved(
        tmp_path / "step-00000001", {"stage_blocks": {"stage-000.pt": (0, 2)}}
    )
    with pytest.raises(ConfigError, match=r"stage-000.pt cannot be read \(.*\): remove"):
        checkpoint.load_stage(legacy, model[:2], None, 0, 2)


def test_a_checkpoint_of_another_model_is_a_one_line_error(tmp_path: Path) -> None:
    model = _model()
    _write(tmp_path, 1, [(model, torch.optim.Adam(model.parameters()), 0, 5)])
    saved = checkpoint.latest(tmp_path)
    assert saved is not None
    other = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(
        ConfigError, match=re.escape("'3.weight' is (8, 8) there, (4, 8) in the model")
    ):
        checkpoint.load_stage(saved, other, None, 0, 5)
    with pytest.raises(ConfigError, match=re.escape("has no '5.weight'")):
        checkpoint.load_stage(saved, nn.Sequential(*model, nn.Linear(3, 3)), None, 0, 6)
    with pytest.raises(ConfigError, match="holds a model of 5 blocks, this one has 6"):
        checkpoint.check_resumable(saved, blocks=6, optimizer="adam", total=4)
    with pytest.raises(ConfigError, match="holds adam optimizer state, this run uses sgd"):
        checkpoint.check_resumable(saved, blocks=5, optimizer="sgd", total=4)
    with pytest.raises(ConfigError, match="completed 1 steps already"):
        checkpoint.check_resumable(saved, blocks=5, optimizer="adam", total=1)
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        checkpoint.model_state(tmp_path / "nothing")
    with pytest.raises(ConfigError, match="interval"):
        Checkpointing(str(tmp_path), every=-1)


def test_a_meta_json_that_is_not_utf8_is_damage_passed_over(tmp_path: Path) -> None:
    """A meta.json with bytes that are not UTF-8 (a bad disk block over it) is named and
    passed over like any other damage, not a UnicodeDecodeError; alone, it is an error."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _write(tmp_path, 1, [(model, opt, 0, 5)])
    _write(tmp_path, 2, [(model, opt, 0, 5)])
    meta = tmp_path / "step-00000002" / "meta.json"
    text = meta.read_bytes()
    meta.write_bytes(text[:10] + b"\xff\xfe" + text[12:])
    saved = checkpoint.latest(tmp_path)
    assert saved is not None and saved.step == 1
    assert saved.passed_over == (
        f"checkpoint {meta.parent} has a damaged meta.json ({len(text)} bytes, byte 0xff at "
        "offset 10 is not UTF-8 text)",
    )
    shutil.rmtree(tmp_path / "step-00000001")
    with pytest.raises(ConfigError, match=r"no intact checkpoint in .*0xff at offset 10"):
        checkpoint.latest(tmp_path)


def test_a_resume_past_only_incomplete_steps_says_so_and_starts_from_scratch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step a run died while writing (no meta.json) and a file named like a step are
    named, each with why, and the resume starts from scratch (docs/runtime.md); neither is
    damage, so neither stops it. Without --resume nothing is said."""
    model = _model()
    checkpoint.write_stage(tmp_path, 3, 0, checkpoint.stage_state(model, None, 3))
    (tmp_path / "step-00000005").write_text("my notes\n")
    saved, passed = checkpoint.survey(tmp_path)
    assert saved is None
    assert passed == (
        f"checkpoint {tmp_path / 'step-00000005'} {checkpoint.STRAY}",
        f"checkpoint {tmp_path / 'step-00000003'} {checkpoint.INCOMPLETE}",
    )
    job = _job(tmp_path, 4, resume=True)
    assert job.resume_from() is None
    _tell_passed_over(job)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"pipecast: {line}; no intact checkpoint: starting from scratch" for line in passed
    ]
    _tell_passed_over(_job(tmp_path, 4))
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"step-00000005 is a file where the checkpoint of"):
        checkpoint.write_rank(tmp_path, 5, 0, torch.device("cpu"))
    assert (tmp_path / "step-00000005").read_text() == "my notes\n"


def test_due_after_every_interval_and_always_at_the_end() -> None:
    cp = Checkpointing("d", every=3)
    assert [d for d in range(1, 11) if cp.due(d, 10)] == [3, 6, 9, 10]
    assert [d for d in range(1, 6) if Checkpointing("d").due(d, 5)] == [5]


def _job(
    root: Path | None,
    steps: int,
    *,
    resume: bool = False,
    schedule: str = "1f1b",
    ranks: int = 2,
    bounds: tuple[int, ...] = (0, 6, 12),
    replicas: int = 1,
    optimizer: str = "adam",
) -> TrainJob:
    config = RunConfig(lr=0.01, timeout_s=20, optimizer=optimizer)  # type: ignore[arg-type]
    job = pipeline_job(
        LENET,
        schedule,
        ranks,
        4,
        list(bounds),
        batch=8,
        steps=steps,
        config=config,
        replicas=replicas,
    )
    if root is None:
        return job
    return replace(job, checkpoint=Checkpointing(str(root), every=1, resume=resume))


@pytest.fixture(scope="module")
def killed(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, torch.Tensor], Path, RankLost]:
    """Adam over a 2-rank 1F1B pipeline: the weights after 5 uninterrupted steps, and the
    checkpoints (steps 2 and 3) of a run whose rank 1 died at the start of step 3 of 5, with
    the error it ended on. Tests copy the checkpoints before they resume from them."""
    root = tmp_path_factory.mktemp("killed")
    want = merged(run(_job(None, 5)), "params")
    with pytest.raises(RankLost) as err:  # rank 1 dies at the start of step 3
        run(replace(_job(root, 5), before_step=partial(fault, 1, 3, "die")))
    return want, root, err.value


@pytest.mark.slow
def test_a_run_killed_part_way_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, killed: tuple[dict[str, torch.Tensor], Path, RankLost]
) -> None:
    """Adam over a 2-rank 1F1B pipeline: rank 1 dies at the start of step 3 of 5; the rerun
    resumes from the checkpoint of step 3 and ends where a run that never died ends."""
    want, written, _ = killed
    shutil.copytree(written, tmp_path, dirs_exist_ok=True)
    saved = checkpoint.latest(tmp_path)
    assert saved is not None and saved.step == 3
    with pytest.raises(ConfigError, match=re.escape("already holds a checkpoint (step 3)")):
        _job(tmp_path, 5).check()  # not asked to resume: nothing is overwritten
    heard: list[StepProgress] = []  # what a progress bar hears, as the run goes
    resumed = run_job(_job(tmp_path, 5, resume=True), progress=heard.append)
    assert resumed is not None
    assert heard[-1].done == heard[-1].total == 5 and heard[-1].loss is not None
    assert all(p.done >= 4 for p in heard)  # the resumed run starts past step 3
    assert [s.step for s in resumed.reports[0].steps] == [4]  # step 3 warms up, 4 is timed
    assert [done for done, _ in resumed.reports[1].checkpoints] == [4, 5]
    assert_close(merged(resumed, "params"), want, rtol=1e-6)
    assert_close(checkpoint.model_state(tmp_path), want, rtol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]


@pytest.mark.slow
def test_a_lost_rank_is_its_own_error_saying_where_each_rank_was(
    killed: tuple[dict[str, torch.Tensor], Path, RankLost],
) -> None:
    """A rank that died is not bad input: RankLost (exit code 3), a survivor's own words
    first, then the dead rank, then where each rank was with the plan's grid."""
    lost = killed[2]
    assert lost.exit_code == 3
    lines = str(lost).splitlines()
    assert lines[0].startswith("rank 0: lost contact with another rank"), lines[0]
    assert lines[1] == "rank 1 died (exit code 9) before reporting"
    assert lines[2:5] == [
        "where each rank was (the action it was on in [brackets]):",
        "  rank 0 (pipeline rank 0): waiting at the barrier before step 3",
        "  rank 1: no word from it",
    ]
    assert lines[5:] == render_grid(_job(None, 5).plan).splitlines()


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_resumes_from_the_one_before(
    tmp_path: Path,
    killed: tuple[dict[str, torch.Tensor], Path, RankLost],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Random bytes in a stage file of the newest checkpoint (step 3), or its meta.json cut
    short: the run says so in one line, resumes from step 2 on every rank and ends on the
    weights of a run that never stopped; the damaged step is written afresh."""
    want, written, _ = killed
    damages = {
        "has stage-001.pt damaged: it does not match the sha256 written with it": lambda d: _damage(
            d / "stage-001.pt"
        ),
        "has a damaged meta.json": lambda d: (d / "meta.json").write_text(
            (d / "meta.json").read_text()[:-20]
        ),
    }
    for why, damage in damages.items():
        root = tmp_path / why[:9].replace(" ", "-")
        shutil.copytree(written, root)
        damage(root / "step-00000003")
        capsys.readouterr()
        resumed = run(_job(root, 5, resume=True))
        told = capsys.readouterr().err
        assert (
            f"pipecast: checkpoint {root / 'step-00000003'} {why}" in told
            and f"resuming from the newest intact one, {root / 'step-00000002'}\n" in told
        ), told
        assert [s.step for s in resumed.reports[0].steps] == [3, 4]  # resumed after step 2
        assert [done for done, _ in resumed.reports[1].checkpoints] == [3, 4, 5]
        assert_close(merged(resumed, "params"), want, rtol=1e-6)
        assert sorted(p.name for p in root.iterdir()) == ["step-00000004", "step-00000005"]


@pytest.mark.slow
def test_a_checkpoint_resumes_on_another_partition_and_schedule(tmp_path: Path) -> None:
    """Written by 2 ranks under 1F1B, resumed by 3 ranks under ZB-H1 with other boundaries:
    the same weights as 4 uninterrupted steps on the first layout."""
    want = merged(run(_job(None, 4)), "params")
    run(_job(tmp_path, 2))
    resumed = run(_job(tmp_path, 4, resume=True, schedule="zb-h1", ranks=3, bounds=(0, 4, 8, 12)))
    assert_close(merged(resumed, "params"), want, rtol=1e-5)


@pytest.mark.slow
def test_data_parallel_replicas_write_one_copy_and_resume_alone(tmp_path: Path) -> None:
    """Two pipeline replicas (2 x 2 ranks) write each stage once; one pipeline resumes from
    it to the weights of an uninterrupted single pipeline. With momentum, not Adam: Adam's
    division by the root of tiny second moments turns the all-reduce's rounding into 1e-4
    differences between replicas and one pipeline, checkpoint or none."""
    want = merged(run(_job(None, 3, optimizer="momentum")), "params")
    hybrid = run(_job(tmp_path, 1, replicas=2, optimizer="momentum"))
    assert {r.global_rank for r in hybrid.reports} == {0, 1, 2, 3}
    saved = checkpoint.latest(tmp_path)
    assert saved is not None
    assert sorted(p.name for p in saved.path.iterdir()) == [
        "meta.json",
        *(f"rank-00{r}.pt" for r in range(4)),
        "stage-000.pt",
        "stage-001.pt",
    ]
    resumed = run(_job(tmp_path, 3, resume=True, optimizer="momentum"))
    assert_close(merged(resumed, "params"), want, rtol=1e-5)


@pytest.mark.slow
def test_pipedream_resumes_with_its_weight_versions(tmp_path: Path) -> None:
    """PipeDream updates after every micro-batch: the weights and each stage's version count
    after a resume match a run that never stopped."""
    want = run(_job(None, 4, schedule="pipedream"))
    run(_job(tmp_path, 2, schedule="pipedream"))
    resumed = run(_job(tmp_path, 4, resume=True, schedule="pipedream"))
    assert_close(merged(resumed, "params"), merged(want, "params"), rtol=1e-6)
    saved = checkpoint.latest(tmp_path)
    assert saved is not None and saved.step == 4
    for path in saved.path.glob("stage-*.pt"):
        assert torch.load(path, weights_only=True)["version"] == 4 * 4  # M=4 updates a step


def _dropout_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 32),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(32, 10),
    )


@pytest.mark.slow
def test_a_resumed_run_draws_the_dropout_masks_an_uninterrupted_one_draws(
    tmp_path: Path,
) -> None:
    """Dropout on both ranks: after a resume from step 2, steps 3 and 4 must draw the masks
    they would have drawn, so every rank's generators come back with the checkpoint."""

    def job(root: Path | None, steps: int, resume: bool = False) -> TrainJob:
        config = RunConfig(lr=0.05, timeout_s=20, optimizer="momentum")
        out = pipeline_job(
            LENET, "1f1b", 2, 4, [0, 4, 8], batch=8, steps=steps, config=config,
            model=_dropout_model(),
        )  # fmt: skip
        if root is None:
            return out
        return replace(out, checkpoint=Checkpointing(str(root), every=1, resume=resume))

    want = merged(run(job(None, 4)), "params")
    first, bare = tmp_path / "first", tmp_path / "bare"
    run(job(first, 2))
    shutil.copytree(first, bare)
    resumed = merged(run(job(first, 4, resume=True)), "params")
    assert_close(resumed, want, rtol=1e-6)
    # the generators matter: the same resume with them left at the seed lands elsewhere
    for rank_file in bare.glob("step-*/rank-*.pt"):
        rank_file.unlink()
    unseeded = merged(run(job(bare, 4, resume=True)), "params")
    assert max((unseeded[n] - want[n]).abs().max().item() for n in want) > 1e-3
