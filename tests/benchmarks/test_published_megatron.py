"""Megatron-LM's Table 1 rows against themselves and the paper's equations, the scale
suite's GPT shapes against the rows, and the report priced as predict() prices each
layout written out by hand (benchmarks/published_megatron.py, benchmarks/scale.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from benchmarks.published_megatron import ROWS, Row, iteration_flops, main, report
from benchmarks.scale import SHAPES, profile_name, workload_of
from tests.benchmarks.test_published import _hand_profile

from pipecast.planning.recommend.predict import predict
from pipecast.values.hardware.presets import preset
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

V, S = 51200, 2048


def _eq2(layers: int, h: int) -> int:
    """The paper's Eq. 2, P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)), multiplied out."""
    return 12 * layers * h * h + 13 * layers * h + (V + S) * h


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.shape)
def test_each_row_holds_together(row: Row) -> None:
    """A typo in a copied row shows: its sizes give its parameter count by Eq. 2 (to the
    table's 0.1B), its TFLOP/s x GPUs its aggregate (to 1%, the table rounds), its TFLOP/s
    its share of the A100's 312 (to a point); its layout fills its GPUs, and its batch
    cuts into micro-batches of 1 in whole rounds of its pipeline, its layers into stages."""
    assert _eq2(row.layers, row.width) / 1e9 == pytest.approx(row.billions, abs=0.05)
    assert row.tflops * row.gpus / 1000 == pytest.approx(row.petaflops, rel=0.01)
    assert 100 * row.tflops / 312 == pytest.approx(row.peak_percent, abs=1)
    assert row.tp * row.pp * row.dp == row.gpus
    assert row.batch % row.dp == 0 and (row.batch // row.dp) % row.pp == 0
    assert row.layers % row.pp == 0 and row.width % row.heads == 0
    if row.pp > 1:
        assert (row.layers // row.pp) % row.virtual == 0


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.shape)
def test_the_suites_gpt_is_the_rows_model(row: Row) -> None:
    """The zoo GPT built at the row's shape holds Eq. 2's parameters but for its untied
    head (V x h) and the head's norm (2 h): the suite profiles the table's model."""
    shape = SHAPES[row.shape]
    assert (shape.width, shape.layers, shape.heads) == (row.width, row.layers, row.heads)
    assert shape.tp == ((row.tp,) if row.tp > 1 else ())
    workload = Workload(**workload_of(row.shape, dry=False))
    assert (workload.seq_len, workload.vocab) == (S, V)
    count = sum(p.numel() for p in workload.build("meta").parameters())
    assert count - V * row.width - 2 * row.width == _eq2(row.layers, row.width)


SMALLEST, PIPELINED = ROWS[0], ROWS[4]  # 1.7B on 32 GPUs; 39.1B, TP 8 x PP 2 x DP 32


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("megatron")
    for row in (SMALLEST, PIPELINED):
        _hand_profile(row.shape).save(str(folder / profile_name(row.shape, "eager")))
    return folder


def test_a_row_is_priced_as_predict_prices_its_layout_by_hand(profiles: Path) -> None:
    """TFLOP/s per GPU = Eq. 3's FLOPs / (predict's step x GPUs), each layout written out:
    32 replicas accumulating 16 micro-batches of 1 over 512 sequences; 32 replicas of an
    interleaved pipeline of 2 stages x 2 a rank, TP 8, 48 micro-batches of 1 over 1536;
    recomputation and Adam both. The ratio is the second over the first."""
    outcomes, ratios = report(profiles, rows=(SMALLEST, PIPELINED))
    by_hand = [
        (Strategy(kind="data", replicas=32, microbatches=16, recompute="all"), 32, 512, 24),
        (
            Strategy(
                kind="hybrid",
                stages=2,
                replicas=32,
                schedule="interleaved",
                virtual=2,
                microbatches=48,
                recompute="all",
                tp=8,
            ),
            512,
            1536,
            48,
        ),
    ]
    expected = []
    for (strategy, gpus, batch, layers), o in zip(by_hand, outcomes, strict=True):
        profile = Profile.load(str(profiles / profile_name(o.row.shape, "eager")))
        cluster = replace(preset("h100-superpod"), nodes=gpus // 8)
        step = predict(profile, cluster, strategy, batch, optimizer="adam").step_time
        # the dry profile's sizes: width 64, sequence 64, vocabulary 256
        flops = 96 * batch * 64 * layers * 64 * 64 * (1 + 64 / (6 * 64) + 256 / (16 * layers * 64))
        assert iteration_flops(batch, 64, layers, 64, 256) == pytest.approx(flops)
        expected.append(flops / (step * gpus) / 1e12)
        assert o.predicted == pytest.approx(expected[-1], rel=1e-12), o.row.label
    [ratio] = ratios
    assert ratio["published"] == pytest.approx(138 / 137)
    assert ratio["predicted"] == pytest.approx(expected[1] / expected[0])


def test_a_row_without_its_profile_or_tp_reading_says_so(profiles: Path, tmp_path: Path) -> None:
    outcomes, ratios = report(profiles, rows=(SMALLEST, ROWS[-1]))
    assert outcomes[1].why_not == "no profile of gpt1008b (gpt1008b_eager.json)"
    assert ratios[0]["predicted"] is None and ratios[0]["published"] == pytest.approx(163 / 137)
    plain = _hand_profile(PIPELINED.shape)
    replace(plain, tensor_parallel={}).save(str(tmp_path / profile_name(PIPELINED.shape, "eager")))
    [alone], _ = report(tmp_path, rows=(PIPELINED,))
    assert alone.why_not == "the profile has no TP 8 reading"


def test_the_script_prints_a_line_per_row_and_the_ratios(
    profiles: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Every row is listed (predicted where its profile is there); the ratio of the
    largest over the smallest comes first."""
    main(["--profiles", str(profiles), "--json", str(tmp_path / "rows.json")])
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("| ") and "TP " in line for line in out) == len(ROWS)
    first = next(line for line in out if line.startswith("| 1008B / 1.7B"))
    assert "1.190" in first  # 163 / 137
    assert (tmp_path / "rows.json").exists()


@pytest.mark.slow  # the profiler's passes: half a minute on a shared 2-core CPU
def test_a_shape_too_large_to_profile_whole_takes_a_ranks_share(tmp_path: Path) -> None:
    """scale.py's dry run of the 1T model (CPU, width 64): only a TP 8 rank's share of
    its two layers is measured; it stands for the whole blocks too, tiled to 128 layers,
    and the profile says so."""
    from benchmarks.scale import Job, _profile

    assert not SHAPES["gpt1008b"].whole
    _profile(Job("gpt1008b", "eager", (1,), True, str(tmp_path)))
    profile = Profile.load(str(tmp_path / "gpt1008b_eager.json"))
    assert profile.num_blocks == 1 + 128 + 1 and set(profile.tensor_parallel) == {8}
    share = profile.tensor_parallel[8]
    assert [b.params for b in share] == [b.params for b in profile.blocks]
    # a rank's layer holds its eighth of the projections (12 h^2 / 8) and whole norms
    # and biases that follow the rows (4 h + 2 h + 2 h) and the split ones' eighth
    h = 64
    assert share[1].params == 12 * h * h // 8 + (3 * h + 4 * h) // 8 + h + h + 4 * h
    assert "stands for the whole layers (not measured)" in profile.tiled
