"""The tensor-parallel degrees a recommendation profiles a model at (calibrate)."""

from __future__ import annotations

from pipecast.orchestration.recommend.calibrate import tensor_parallel_degrees
from pipecast.values.models import Workload


def test_a_captured_llama_is_profiled_at_the_degrees_its_heads_allow() -> None:
    """4 query heads and 2 key/value heads: 2 ranks share them, 4 would split a key/value
    head (and 8 a query head)."""
    llama = Workload(model="tests.user_models:small_llama", dataset="tokens", seq_len=8, vocab=64)
    assert tensor_parallel_degrees(llama, 8) == (2,)
