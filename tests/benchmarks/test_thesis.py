"""The thesis's cells (benchmarks/thesis.py): its table transcribed as it scores itself, its
equations wired to a profile and a probe as the thesis defines their symbols, and the picks
read back from a store."""

from __future__ import annotations

import json

import pytest
from tests.values.profile.helpers import shipped_profile

from benchmarks import studies_report as studies
from benchmarks import thesis
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Row
from pipecast.values.hardware.presets import preset
from pipecast.values.models.workload import Workload


def test_table_8_1_scores_as_table_8_2() -> None:
    """Table 8.2 marks 3 of 6 right on MNIST, 1 on CIFAR-10, all 6 on ImageNet and Highres:
    16 of 24, the 66% it reports."""
    right = {d: 0 for d in thesis.DATASETS}
    for (_, dataset), (recommended, fastest) in thesis.TABLE_8_1.items():
        right[dataset] += recommended == fastest
    assert len(thesis.TABLE_8_1) == 24
    assert right == {"mnist": 3, "cifar10": 1, "imagenet": 6, "highres": 6}


def _cfg(system: str, **kw: object) -> BenchConfig:
    base = {"suite": "thesis", "workload": Workload(model="resnet18", dataset="imagenet"),
            "gpus": 4, "batch": 128}  # fmt: skip
    return BenchConfig(system=system, **{**base, **kw})  # type: ignore[arg-type]


def test_equation_5_1_takes_one_worker_share_and_the_gradients() -> None:
    prof, cluster = shipped_profile("resnet18", "h200"), preset("h200-nvlink")
    one = prof.stage(0, prof.num_blocks, 32)
    slowest = max(
        cluster.link(i, (i + 1) % 4).latency
        + min(prof.param_bytes / 1e6, 64.0) / (4 * cluster.link(i, (i + 1) % 4).bandwidth / 1e6)
        for i in range(4)
    )
    want = (one.forward + one.backward) + 2 * 3 * slowest  # T_seq / W is one share's time
    assert thesis.equations(_cfg("ddp"), prof, cluster) == pytest.approx(want)


def test_equations_6_1_and_6_2_for_gpipe() -> None:
    prof, cluster = shipped_profile("resnet18", "h200"), preset("h200-nvlink")
    split = (0, 3, 6, 9, prof.num_blocks)
    cfg = _cfg("pipecast", schedule="gpipe", batch=384, microbatches=12, boundaries=split)
    whole = prof.stage(0, prof.num_blocks, 32)
    compute = 12 * (whole.forward + whole.backward) * (4 + 12 - 1) / (4 * 12)
    link = cluster.link(0, 1)  # every link of the preset is alike
    x = [link.latency + prof.stage(0, b, 32).output_bytes / link.bandwidth for b in split[1:-1]]
    # 3 links, 12 micro-batches: filling x1 + max(x1, x2), 10 full steps of the slowest,
    # draining max(x2, x3) + x3; forward and backward alike
    comm = 2 * (x[0] + max(x[:2]) + 10 * max(x) + max(x[1:]) + x[2])
    got = thesis.equations(cfg, prof, cluster)
    assert got == pytest.approx(compute + comm, rel=1e-9)
    assert thesis.equations(_cfg("torchgpipe", microbatches=12), prof, cluster) is None


def _row(cfg: BenchConfig, measured: float, predicted: float, eq: float) -> Row:
    return Row(
        key=json.dumps(cfg.to_dict()), suite="thesis", status="ok", config=cfg.to_dict(),
        environment={}, measured={"step_time": measured},
        predicted={"step_time": predicted, "thesis_step_time": eq}, error=None,
    )  # fmt: skip


def test_picks_and_errors_read_back_from_a_store() -> None:
    """DDP measures 1,000 samples/s (0.128 s for 128), GPipe 1,280 (0.3 s for 384): GPipe
    is fastest. The simulator predicts both within 10% and picks GPipe; the equations
    predict DDP twice as fast as it ran, and pick it."""
    tags = {"cell": "resnet18/imagenet"}
    gp = _cfg("pipecast", schedule="gpipe", batch=384, microbatches=12, tags=tags)
    rows = [_row(_cfg("ddp", tags=tags), 0.128, 0.1408, 0.064), _row(gp, 0.3, 0.27, 0.3)]
    (cell,) = thesis.cells_of(rows)
    assert (cell.fastest, cell.pick, cell.thesis_pick) == ("GPipe", "GPipe", "Horovod")
    table, lines = studies.thesis_table(rows)
    assert table[1][:4] == ["resnet18/imagenet", "Horovod / Horovod", "GPipe", "GPipe 28%"]
    assert "**1 of 1**" in lines[0] and "equations' pick in 0 of 1" in lines[0]
    assert "median 10.0%" in lines[1]  # |+10%| and |-10%|
    assert "median 25.0%, worst 50.0%" in lines[2]  # |-50%| and |0%|


def _single(microbatches: int, step: float) -> Row:
    cfg = BenchConfig(suite="studies", system="single", microbatches=microbatches, gpus=1,
                      batch=128, workload=Workload(model="vgg16", dataset="imagenet"))  # fmt: skip
    return Row(
        key=str(microbatches), suite="studies", status="ok", config=cfg.to_dict(),
        environment={}, measured={"step_time": step}, predicted=None, error=None,
    )  # fmt: skip


def test_the_gpipe_study_micro_batch_table_beside_a_store() -> None:
    """One GPU's VGG16 at 2 and 32 micro-batches, 50 and 150 ms: 3.00x, beside the study's
    565.858 and 867.52 ms (1.53x); the claim (time grows with M) holds."""
    rows = [_single(2, 0.05), _single(32, 0.15)]
    table = studies.table_4_1(rows)
    assert table[1] == ["2", "565.9 ms", "1.00", "50.00 ms", "1.00"]
    assert table[-1] == ["32", "867.5 ms", "1.53", "150.00 ms", "3.00"]
    assert table[2][3:] == ["-", "-"]  # M=4 not measured
    (claim,) = [c for c in studies.claims(rows) if "Table 4.1" in c[0]]
    assert claim[2:] == ["1.53x from 2 to 32", "3.00x", "yes"]
