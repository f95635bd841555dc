"""Chrome / Perfetto trace export of a Timeline (simulated or measured), and its reading back.

One process per rank, a 'compute' and a 'comm' thread in each; open the JSON in
chrome://tracing or https://ui.perfetto.dev. The runtime writes measured events in the same
form, so a predicted and a measured run open side by side. Each process is named
'<label> rank <r>', which is how `read_trace` finds the timelines and ranks again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pipecast import jsonio
from pipecast.errors import DataError
from pipecast.values.timeline import Event, Timeline

_THREADS = {"send": 2, "allreduce": 2}
QUICK_LABEL = "predicted from the quick profile"
"""How `pipecast train` labels the prediction it draws beside a measured step."""


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


NOT_A_TRACE = "name a trace `pipecast train`, `infer` or `simulate` wrote (NAME.trace.json)"


def read_trace(path: str) -> list[tuple[str, list[Event]]]:
    """The labelled timelines of a trace `write_trace` wrote, in its order, each event back
    on its own rank; a one-line DataError for a file that holds none."""
    doc = jsonio.parse(jsonio.read_text(path), path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise DataError(f"{path} holds {jsonio.describe(doc)}, not a trace: {NOT_A_TRACE}")
    ranks: dict[int, tuple[str, int]] = {}  # pid -> (label, rank)
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
            label, _, number = str(e.get("args", {}).get("name", "")).rpartition("rank ")
            if number.isdigit():
                ranks[int(e["pid"])] = (label.strip(), int(number))
    runs: dict[str, list[Event]] = {}
    try:
        for e in events:
            if e.get("ph") == "X" and e.get("pid") in ranks:
                label, rank = ranks[e["pid"]]
                start, args = e["ts"] / 1e6, e.get("args", {})
                runs.setdefault(label, []).append(
                    Event(rank, str(e["name"]), str(e["cat"]), start, start + e["dur"] / 1e6,
                          int(args.get("stage", -1)), int(args.get("microbatch", -1)))
                )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(
            f"{path} is a damaged trace ({type(exc).__name__}: {exc}): {NOT_A_TRACE}"
        ) from None
    if not runs:
        raise DataError(f"{path} holds no ranks' actions: {NOT_A_TRACE}")
    return list(runs.items())
