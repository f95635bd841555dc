"""Profiles: per-block measured costs (types here; the measuring lives in profiler.py)."""

from pipecast.values.profile.stats import Robust, robust
from pipecast.values.profile.types import BlockCost, BlockProfile, Profile, StageCost

__all__ = ["BlockCost", "BlockProfile", "Profile", "Robust", "StageCost", "robust"]
