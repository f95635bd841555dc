"""Any nn.Module as pipecast's blocks: export it, cut it (graph_cuts), wrap the runs
(graph_blocks).

The batch dimension is exported dynamic, so the same blocks run every micro-batch size the
profiler and the runtime try. A model export cannot take fails with one line naming the
module, the operation and the way out.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator

import torch
from torch import nn

from pipecast.errors import ShapeError
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.models.graph_blocks import GraphBlock, build_blocks
from pipecast.values.models.graph_cuts import choose_cuts

WAY_OUT = (
    "give a factory that returns an nn.Sequential of blocks instead, or move the failing "
    "part into a submodule pipecast need not trace"
)
EXAMPLE_BATCH = 2


def example_input(spec: DatasetSpec, batch: int = EXAMPLE_BATCH) -> torch.Tensor:
    """A batch of `spec`'s input shape on the current default device (meta included)."""
    shape = (batch, *spec.sample_shape)
    if spec.input_kind == "tokens":
        return torch.zeros(shape, dtype=torch.long)
    return torch.zeros(shape)


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "---")):
            return re.sub(r"\s+", " ", line)[:240]
    return type(exc).__name__


@contextlib.contextmanager
def _said_only_if_it_works() -> Iterator[None]:
    """What torch writes to stderr while it exports, kept back unless the export works: a
    failing one logs a warning and prints its partial graph twice (twenty lines and more),
    where the ShapeError says what went wrong in one. (torch's log handler writes to
    whatever sys.stderr is when it logs.)"""
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        yield
    sys.stderr.write(said.getvalue())  # reached only where the export worked


def capture(
    module: nn.Module, spec: DatasetSpec, *, name: str, max_blocks: int = 48
) -> nn.Sequential:
    """`module` (built for `spec`'s inputs) as an nn.Sequential of GraphBlocks."""
    example = example_input(spec)
    batch = torch.export.Dim("batch", min=1)
    try:
        with _said_only_if_it_works():
            exported = torch.export.export(
                module, (example,), dynamic_shapes=({0: batch},), strict=False
            )
    except Exception as exc:
        raise ShapeError(
            f"cannot capture {name} ({type(module).__name__}) with torch.export: "
            f"{type(exc).__name__}: {_first_line(exc)}; {WAY_OUT}"
        ) from None
    root = exported.module()
    assert isinstance(root, torch.fx.GraphModule)
    try:
        blocks: list[GraphBlock] = build_blocks(root, choose_cuts(root.graph, max_blocks))
    except ValueError as exc:
        raise ShapeError(f"cannot cut {name} into blocks: {exc}; {WAY_OUT}") from None
    return nn.Sequential(*blocks)
