"""Has this host slowed down since the model was profiled?

A host-bound step takes as long as its host needs to issue it, and the profile's host costs
are what the host took when it was profiled. A cached profile may be minutes or days old, and
on shared and virtual machines the host's speed moves in spells: a fixed pure-Python loop
(hostspeed.reference) can read nearly twice as long in one call as in the next on the same
machine (docs/decisions.md, "The host's spells"). The profile keeps that loop's reading;
reading it again
before recommending tells whether the host is in a slower spell now.

On stored GPU runs, host-bound steps measured while the loop read 1.25x or more its
profile's reading ran slower than predicted (error_ranges.slower_miss), while device-bound
steps' errors did not depend on the loop's reading; so a slower host is worth a note where a
close call is host-bound, and a faster one is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipecast.planning.recommend import error_ranges

SLOWER = 1.25
"""The loop's reading now over the profile's from which host-bound predictions ran fast."""

SLOWER_MISS = error_ranges.slower_miss()
"""How much slower than predicted host-bound steps ran, as a median, where the loop read
SLOWER or more its profile's reading (pipecast.planning.recommend.error_ranges)."""


@dataclass(frozen=True)
class HostDrift:
    profiled: float
    """hostspeed.reference() seconds while profiling."""
    now: float
    """... and now."""
    elsewhere: bool = False
    """The profile was taken on another machine (hostspeed.machine() differs)."""
    cached: bool = True
    """The profile is the calibration's cache (False: one the user gave), which
    `--recalibrate` measures again."""

    @property
    def ratio(self) -> float:
        """How many times slower the host runs now than when profiled."""
        return self.now / self.profiled

    def note(self, host_bound: bool) -> str | None:
        """A line for the user where the host has slowed and host-bound strategies are
        among those recommended; None otherwise."""
        if not host_bound or self.ratio < SLOWER:
            return None
        than = (
            "the host the model was profiled on"
            if self.elsewhere
            else "when the model was profiled"
        )
        remedy = "--recalibrate (profile again)" if self.cached else "pipecast profile here"
        return (
            f"this host runs {self.ratio:.2f}x slower now than {than} (a fixed Python loop: "
            f"{self.now * 1e3:.1f} ms against {self.profiled * 1e3:.1f} ms), and host-bound "
            f"steps follow it: on stored GPU runs they then ran a median {SLOWER_MISS:.0%} "
            f"slower than predicted. To follow it: {remedy}, or --validate auto (measure)"
        )

    def to_dict(self) -> dict[str, float | bool]:
        return {
            "profiled": self.profiled,
            "now": self.now,
            "ratio": self.ratio,
            "elsewhere": self.elsewhere,
        }


def host_drift(
    profiled: float,
    now: float,
    *,
    profiled_on: str = "",
    here: str = "",
    cached: bool = True,
) -> HostDrift | None:
    """The drift between two readings of hostspeed.reference(), the profile's taken on
    `profiled_on` and this one on `here` (hostspeed.machine(); unrecorded counts as the
    same machine); None where either reading is missing (profiles taken before the
    profiler read it have 0)."""
    if profiled <= 0 or now <= 0:
        return None
    return HostDrift(profiled, now, bool(profiled_on and here and profiled_on != here), cached)
