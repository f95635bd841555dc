"""A matplotlib figure written as an image file, through the one checked write
(jsonio.write_atomic): never over a link, a device or a folder, never half written."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from pipecast import jsonio


def save_figure(fig: Figure, path: str, *, dpi: int) -> str:
    """Render `fig` in the format its file name says (PNG where it says none), write it to
    `path` and close it; `path`."""
    image = io.BytesIO()
    try:
        fig.savefig(image, format=Path(path).suffix.lstrip(".").lower() or "png", dpi=dpi)
    finally:
        plt.close(fig)
    jsonio.write_atomic(path, image.getvalue())
    return path
