"""HostReadings: how fast the host ran while a profile was taken (Profile.host)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipecast.values.profile.stats import range_spread


@dataclass(frozen=True, kw_only=True)
class HostReadings:
    """How fast the host ran while the profile was taken, and how its host costs were read:
    host-bound steps follow the host's speed, which moves in spells, so a prediction from
    these costs is only as good as the spell they caught (pipecast.measuring.hostspeed)."""

    split_call: float = 0.0
    """Host seconds one split-backward B call costs whatever it covers (walking the graph,
    hooking it, entering autograd). Each block's `host_backward_input` was timed in a call of
    its own; a stage makes one call per segment (pipecast.values.profile.segments), so its B pays
    this once per segment."""
    reference: float = 0.0
    """hostspeed.reference() while profiling (the median of readings before and after each
    size): how fast the host ran when its times were taken (0: not recorded)."""
    issue: float = 0.0
    """hostspeed.issue() at the same points and after each host window beyond the sizes'
    own (the median of them all): the torch host work of a fixed tiny model, as fast as
    this process issued it while profiling (0: not recorded)."""
    machine: str = ""
    """hostspeed.machine() where the profile was taken (empty: not recorded)."""
    cpu: str = ""
    """hostspeed.cpu_model() where the profile was taken (empty: not recorded): host costs
    read on one CPU model do not describe another's."""
    pooled: int = 1
    """How many profiles' readings the host costs, the split-call cost, the issue and the
    reference are the mean of (pipecast.values.profile.pool; 1: this profile's own)."""
    size_issue: dict[int, float] = field(default_factory=dict)
    """Micro-batch size -> hostspeed.issue() read beside that size's host costs (empty: not
    recorded)."""
    windows: int = 1
    """Windows of whole-model passes each size's host costs are the median of
    (ProfileOptions.host_windows; 0 for profiles without whole-model passes)."""
    window_host: dict[int, tuple[float, ...]] = field(default_factory=dict)
    """Micro-batch size -> each window's host seconds issuing the whole model's forward and
    backward, in the order taken (empty: not recorded)."""

    def window_spread(self) -> dict[int, float]:
        """Micro-batch size -> how far its windows' whole-model host times lay apart,
        (largest - smallest) / median, where it was read in more than one window."""
        return {size: range_spread(v) for size, v in self.window_host.items() if len(v) > 1}
