"""A workload's sizes: what no model can have is refused where the workload is made."""

from __future__ import annotations

import pytest

from pipecast.errors import ConfigError
from pipecast.values.models import Workload


@pytest.mark.parametrize(
    ("field", "value"),
    [("seq_len", 0), ("vocab", -1), ("width", 0), ("layers", -1), ("heads", -2), ("ffn", -1)],
)
def test_a_workload_refuses_sizes_no_model_has(field: str, value: int) -> None:
    with pytest.raises(ConfigError, match=f"{field} must be"):
        Workload(model="gpt", dataset="tokens", **{field: value})
