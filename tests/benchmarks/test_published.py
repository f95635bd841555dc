"""The scale suite's shapes and the published rows' layouts against their sources, and the
report script end to end on hand-made dry-run profiles (benchmarks/scale.py,
benchmarks/published.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from benchmarks.published import RATIOS, ROWS, main, report, strategy_of
from benchmarks.scale import SHAPES, profile_name, workload_of

from pipecast.values.models.workload import Workload
from pipecast.values.profile.tile import layer_repeat, tiled
from pipecast.values.profile.types import BlockCost, BlockProfile, Profile


@pytest.mark.parametrize(("shape", "billions"), [("8b", 8.03), ("70b", 70.55), ("405b", 405.85)])
def test_the_shapes_have_metas_parameter_counts(shape: str, billions: float) -> None:
    """Meta's model card: Llama 3.1 8B, 70B and 405B hold 8.03, 70.55 and 405.85 billion
    parameters (untied embedding and head)."""
    workload = Workload(**workload_of(shape, dry=False))
    count = sum(p.numel() for p in workload.build("meta").parameters())
    assert count / 1e9 == pytest.approx(billions, abs=0.01)


def test_each_rows_layout_holds_the_tables_gpus_and_global_batch() -> None:
    """torchtitan's tables state each run's GPUs and global batch: 16 and 256 sequences for
    the 8B on 8 and 128 GPUs, 512 for the 70B, 256 for the 405B."""
    stated = {"Table 1": 16, "Table 3": 256, "Table 4": 512, "Table 5": 256}
    for row in ROWS:
        assert row.fsdp * row.tp * row.pp * row.cp == row.gpus, row.label
        if row.table in stated:
            assert row.global_batch == stated[row.table], row.label
    labels = {row.label for row in ROWS}
    assert all(top in labels and bottom in labels for _, top, bottom in RATIOS)


def _hand_profile(shape: str) -> Profile:
    """A dry-run profile of `shape` made by hand: embedding, two layers and a head timed
    at 1 and 2 sequences, tiled to the shape's depth; a TP reading where the suite takes
    one (a rank's layer an eighth of the layer)."""
    workload = Workload(**workload_of(shape, dry=True))
    prefix = "Llama" if workload.model == "llama" else ""  # the zoo GPT's: Block
    layer = f"{prefix}Block"
    measured = [(f"{prefix}Embedding", 1e-4), (layer, 1e-2), (layer, 1e-2), (f"{prefix}Head", 5e-3)]

    def blocks(share: float) -> tuple[BlockProfile, ...]:
        return tuple(
            BlockProfile(
                index=i,
                name=name,
                params=10**6,
                param_bytes=2 * 10**6,
                input_counted=True,
                forward_flops=10**9,
                costs={
                    b: BlockCost(
                        forward=t * b * (share if name == layer else 1),
                        backward_input=t * b,
                        backward_weight=t * b,
                        backward=2 * t * b,
                        output_bytes=10**6 * b,
                        saved_bytes=10**7 * b,
                        selective_bytes=4 * 10**6 * b,  # as the profiler reads it
                    )
                    for b in (1, 2)
                },
            )
            for i, (name, t) in enumerate(measured)
        )

    profile = Profile(
        model=workload.model,
        dataset="tokens",
        device="cpu",
        dtype="fp32",
        torch_version="t",
        micro_batch_sizes=(1, 2),
        input_bytes_per_sample=8 * workload.seq_len,
        blocks=blocks(1.0),
        tensor_parallel={d: blocks(1 / d) for d in SHAPES[shape].tp},
        workload=replace(workload, layers=2).to_dict(),
    )
    return tiled(profile, 2, workload.layers, layer_repeat(workload))


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scale")
    for shape in SHAPES:
        _hand_profile(shape).save(str(folder / profile_name(shape, "eager")))
    return folder


def test_every_row_is_predicted_or_says_why_not(profiles: Path) -> None:
    """One outcome per published row, in their order: a prediction, or why there is none;
    the context-parallel rows beside FSDP (pipecast prices CP beside whole copies alone)
    and the sequences the suite did not profile are refused, and every 8 192-token row
    without CP or async TP is predicted."""
    outcomes, ratios = report(profiles, dry=True)
    assert [o.row for o in outcomes] == list(ROWS)
    for o in outcomes:
        assert (o.predicted is None) != (o.why_not == ""), o.row.label
        if o.row.cp > 1 and o.row.fsdp > 1:
            assert o.why_not.startswith("context parallelism"), o.row.label
        elif o.row.seq_len != 8192:
            assert o.why_not.startswith("sequence"), o.row.label
        elif not o.row.unexpressible:
            assert o.predicted is not None and o.predicted > 0, (o.row.label, o.why_not)
    by_label = {o.row.label: o for o in outcomes}
    # compiled rows priced from the eager profile (dry): the ratio is 1, published 1.157
    compiled = next(r for r in ratios if r["ratio"] == "compiled / eager, 8 GPUs")
    assert compiled["published"] == pytest.approx(6667 / 5762)
    assert compiled["predicted"] == pytest.approx(1.0)
    one_f_one_b = by_label["405B FSDP 8 x TP 8 x PP 8, 1F1B"]
    assert any("async TP" in note for note in one_f_one_b.notes)


def test_without_dry_a_missing_execution_is_named(profiles: Path) -> None:
    outcomes, _ = report(profiles, dry=False)
    compiled = next(o for o in outcomes if o.row.label == "8B FSDP 8, compiled")
    assert compiled.why_not == "no profile of 8b compiled (llama-8b_compiled.json)"


def test_the_script_prints_a_line_per_row(
    profiles: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    main(["--profiles", str(profiles), "--dry", "--json", str(tmp_path / "rows.json")])
    out = capsys.readouterr().out
    assert sum(line.startswith("| Table") for line in out.splitlines()) == len(ROWS)
    assert (tmp_path / "rows.json").exists()


def test_each_rows_strategy_spans_its_gpus() -> None:
    """The Strategy of every row holds the row's GPUs: FSDP x TP x PP x CP (a CP row of
    FSDP 1 too, whose sequence is split over all 8)."""
    for row in ROWS:
        strategy, _ = strategy_of(row)
        assert strategy.gpus == row.gpus, row.label
        assert strategy.cp == row.cp, row.label
