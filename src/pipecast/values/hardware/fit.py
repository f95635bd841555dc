"""Fit transfer times to `latency + bytes / bandwidth` (the alpha-beta model)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipecast.errors import ConfigError
from pipecast.values.hardware.cluster import Link


def fit_link(sizes: Sequence[float], seconds: Sequence[float]) -> Link:
    """Least squares in relative error, so that small messages fix the latency and large
    ones the bandwidth. Needs at least two distinct sizes."""
    x = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if len(x) != len(t) or len(np.unique(x)) < 2:
        raise ConfigError("fitting a link needs times at two or more message sizes")
    if (t <= 0).any():
        raise ConfigError("transfer times must be positive")
    weights = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (latency, inv_bw), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
    if inv_bw <= 0:  # times do not grow with size: bandwidth beyond what was measured
        inv_bw = float(np.min(t / x))
    return Link(latency=max(float(latency), 0.0), bandwidth=float(1.0 / inv_bw))
