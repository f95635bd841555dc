"""On GPUs (skipped without two): the captured CUDA graphs give an eager run's numbers.

CI has no GPU; these run where one is lent (`python -m pytest tests/runtime/test_gpu.py`).
On CPU ranks the engine's side of the graphs is checked against one process instead
(test_graphs.py)."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.helpers import merged, pipeline_job, run

from pipecast.runtime.config import RunConfig
from pipecast.values.models.workload import Workload

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
LENET = Workload(model="lenet5", dataset="mnist")
GPT = Workload(model="transformer", dataset="embeddings", seq_len=64, width=64, layers=4, heads=4)


def _params(
    workload: Workload, schedule: str, bounds: list[int], graphs: bool, **cfg: object
) -> dict[str, torch.Tensor]:
    config = RunConfig(lr=0.1, timeout_s=120, cuda_graphs=graphs, **cfg)  # type: ignore[arg-type]
    job = pipeline_job(
        workload, schedule, 2, 4, bounds, batch=8, steps=3, config=config, device="cuda"
    )
    return merged(run(job), "params")


@pytest.mark.parametrize(
    ("schedule", "bounds", "extra"),
    [
        ("gpipe", [0, 6, 12], {}),
        ("1f1b", [0, 6, 12], {"recompute": "all"}),
        ("interleaved", [0, 3, 6, 9, 12], {}),
        ("zb-h1", [0, 5, 12], {}),
        ("zb-v", [0, 3, 6, 9, 12], {"recompute": "all"}),
        ("zb-h1", [0, 5, 12], {"dtype": "bf16", "autocast": True}),
    ],
)
def test_graphed_steps_equal_eager_steps_on_gpus(
    schedule: str, bounds: list[int], extra: dict[str, object]
) -> None:
    eager = _params(LENET, schedule, bounds, False, **extra)
    graphed = _params(LENET, schedule, bounds, True, **extra)
    for name, want in eager.items():
        assert torch.allclose(graphed[name], want, rtol=1e-5, atol=1e-6), name


def test_a_graphed_transformer_equals_its_eager_run() -> None:
    bounds = [0, 2, 4]
    eager = _params(GPT, "zb-h1", bounds, False, dtype="fp32")
    graphed = _params(GPT, "zb-h1", bounds, True, dtype="fp32")
    for name, want in eager.items():
        assert torch.allclose(graphed[name], want, rtol=1e-4, atol=1e-6), name
