"""Chrome / Perfetto trace export of a Timeline (simulated or measured).

One process per rank, a 'compute' and a 'comm' thread in each; open the JSON in
chrome://tracing or https://ui.perfetto.dev. The runtime writes measured events in the same
form, so a predicted and a measured run open side by side.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pipecast import jsonio
from pipecast.values.timeline import Event, Timeline

_THREADS = {"send": 2, "allreduce": 2}


def trace_events(
    events: Iterable[Event], *, pid_offset: int = 0, label: str = ""
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ranks: set[int] = set()
    for e in events:
        ranks.add(e.rank)
        out.append(
            {
                "name": e.name,
                "cat": e.kind,
                "ph": "X",
                "pid": e.rank + pid_offset,
                "tid": _THREADS.get(e.kind, 1),
                "ts": e.start * 1e6,
                "dur": max(e.duration, 0.0) * 1e6,
                "args": {"stage": e.stage, "microbatch": e.mb},
            }
        )
    for r in sorted(ranks):
        name = f"{label} rank {r}".strip()
        out.append(
            {"name": "process_name", "ph": "M", "pid": r + pid_offset, "args": {"name": name}}
        )
        for tid, tname in ((1, "compute"), (2, "comm")):
            out.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": r + pid_offset,
                    "tid": tid,
                    "args": {"name": tname},
                }
            )
    return out


def write_trace(path: str, *timelines: tuple[str, Timeline]) -> None:
    """Write one or more labelled timelines (e.g. 'predicted', 'measured') to one trace."""
    events: list[dict[str, Any]] = []
    offset = 0
    for label, timeline in timelines:
        events += trace_events(timeline.events, pid_offset=offset, label=label)
        offset += 100
    jsonio.write_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
