"""The hold before a profiling pass whose device times hide the host's issuing
(ProfileOptions.hide_issue): how long to hold the device, and when to give up."""

from __future__ import annotations

from dataclasses import dataclass

HIDE_LEAD = 1.5
"""A hold lasts this many times the host's issue time of the last pass."""
HIDE_CAP = 8.0
"""A hold lasts at most this many times the first pass's issue time (taken with no hold)."""


def next_lead(lead: float, issued: float, hidden: bool) -> float:
    """The hold before the next pass, after one that took the host `issued` seconds to issue
    and whose hold did (`hidden`) or did not outlast that: HIDE_LEAD x the issue time, and
    at least double the last hold when it fell short (the host has slow spells)."""
    longer = HIDE_LEAD * issued
    return max(lead, longer) if hidden else max(2 * lead, longer)


@dataclass(slots=True)
class Hold:
    """The hold before each pass with hide_issue, grown by next_lead up to HIDE_CAP x the
    first pass's issue time. A pass whose host waits on its device (CUDA's launch queue
    full behind the hold, or a sync inside the pass) takes the host the hold plus its own
    issuing, so no hold outlasts it: when the longest hold falls short, hiding is given up
    rather than grown without end (a GPT hold once grew for over five minutes)."""

    lead: float = 0.0
    """Seconds the device is held before the next pass."""
    cap: float | None = None
    given_up: bool = False

    def after(self, *, issued: float, held: float) -> bool:
        """Whether a pass the host took `issued` seconds to issue, behind a hold the device
        spent `held` seconds in, was hidden; sets the next hold."""
        hidden = held >= issued
        if self.cap is None:  # the first pass: no hold yet, its plain issue time
            self.cap = HIDE_CAP * issued
        elif not hidden and self.lead >= self.cap:
            self.given_up = True
        self.lead = min(next_lead(self.lead, issued, hidden), self.cap)
        return hidden
