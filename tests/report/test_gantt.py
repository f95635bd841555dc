"""The Gantt chart draws every event as a bar on its rank's row, coloured by its kind, at its
start and of its duration (report.gantt)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex

from pipecast.report.gantt import COLOURS, _draw
from pipecast.values.timeline import Event

EVENTS = [
    Event(0, "0F0", "F", 0.0, 0.002, 0, 0),
    Event(0, "0F1", "F", 0.002, 0.004, 0, 1),
    Event(0, "send 0F0", "send", 0.002, 0.0025, 0, 0),
    Event(1, "1F0", "F", 0.0025, 0.0045, 1, 0),
    Event(1, "1BW0", "BW", 0.0045, 0.0085, 1, 0),
    Event(0, "0BW0", "BW", 0.009, 0.013, 0, 0),
]


def test_every_event_is_one_bar_where_and_as_long_as_it_ran() -> None:
    fig, ax = plt.subplots()
    _draw(ax, EVENTS, 2, 1e3, "ms")
    bars = []
    for collection in ax.collections:
        colour = to_hex(collection.get_facecolor()[0])
        for path in collection.get_paths():
            (x0, y0), (x1, y1) = path.vertices.min(axis=0), path.vertices.max(axis=0)
            bars.append((round(x0, 6), round(x1 - x0, 6), round((y0 + y1) / 2, 6), colour))
    plt.close(fig)
    want = [
        (
            round(e.start * 1e3, 6),
            round(e.duration * 1e3, 6),
            e.rank + (0.32 if e.kind == "send" else 0.0),
            to_hex(COLOURS[e.kind]),
        )
        for e in EVENTS
    ]
    assert sorted(bars) == sorted(want)
