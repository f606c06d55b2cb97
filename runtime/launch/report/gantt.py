"""The lease timeline as a Gantt chart: one row per worker, one bar per lease.

Bars are coloured by role; a weight load is a black bar under the lease bars of its
worker's row, a failed or expired lease is hatched, and each train step is a thin grey
line across all rows. Two panels: the whole run, where the density shows which roles kept
busy, and a window of a few train steps from the middle of the run, where single leases
can be told apart and the overlap of generation and training is plain to see.
"""

from __future__ import annotations

import statistics

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .style import role_colour
from .timeline import Timeline

__all__ = ["draw_gantt"]

_ZOOM_STEPS = 6  # train steps shown in the close-up
_BAR = 0.7  # a lease bar's height, of a row's
_WEIGHT = 0.2  # a weight load's


def draw_gantt(timeline: Timeline, title: str) -> Figure:
    """The two-panel chart of ``timeline``."""
    height = 1.2 + 0.32 * len(timeline.rows)
    fig = Figure(figsize=(12, 2 * height + 0.8), layout="constrained")
    whole, zoom = fig.subplots(2, 1)
    _panel(whole, timeline, (0.0, max(timeline.span, 1e-3)), "whole run")
    window = _middle_window(timeline)
    _panel(zoom, timeline, window, f"close-up: {window[1] - window[0]:.1f} s mid-run")
    roles = list(dict.fromkeys(role for role, _ in timeline.rows))
    handles = [Patch(color=role_colour(r), label=r) for r in roles]
    handles.append(Patch(color="black", label="weight load"))
    fig.legend(handles=handles, loc="outside upper right", ncols=len(handles), frameon=False)
    fig.suptitle(title, x=0.01, ha="left")
    return fig


def _panel(ax: Axes, timeline: Timeline, window: tuple[float, float], label: str) -> None:
    lo, hi = window
    least = (hi - lo) / 500  # a bar narrower than a pixel or so is drawn this wide
    for (role, worker), y in zip(timeline.rows, range(len(timeline.rows)), strict=True):
        bars = [b for b in timeline.leases.get(worker, []) if b.end >= lo and b.start <= hi]
        ok = [(b.start, max(b.end - b.start, least)) for b in bars if b.outcome == "complete"]
        bad = [(b.start, max(b.end - b.start, least)) for b in bars if b.outcome != "complete"]
        colour = role_colour(role)
        # A white edge parts back-to-back leases (a trainer claims its next step at once).
        ax.broken_barh(
            ok, (y - _BAR / 2, _BAR), facecolors=colour, edgecolors="white", linewidth=0.4
        )
        if bad:
            ax.broken_barh(
                bad,
                (y - _BAR / 2, _BAR),
                facecolors="white",
                edgecolors=colour,
                hatch="////",
                linewidth=0.5,
            )
        loads = [(b.start, max(b.end - b.start, least)) for b in timeline.weights.get(worker, [])]
        if loads:
            ax.broken_barh(loads, (y + _BAR / 2, _WEIGHT), facecolors="black", linewidth=0)
    for at, _step in timeline.steps:
        if lo <= at <= hi:
            ax.axvline(at, color="0.6", linewidth=0.5, zorder=0)
    ax.set_yticks(range(len(timeline.rows)), [w for _, w in timeline.rows])
    ax.set_ylim(len(timeline.rows) - 0.4, -0.6)  # first row on top
    ax.set_xlim(lo, hi)
    ax.set_xlabel("seconds since the trace began")
    ax.set_title(f"{label} (grey lines: train steps)", loc="left", fontsize="medium")


def _middle_window(timeline: Timeline) -> tuple[float, float]:
    """A few train steps' worth of time near the middle of the run, not straddling a
    pause (a resumed run's downtime): of the windows of as many steps, the one nearest
    the middle that is at most twice as long as the median window."""
    times = [t for t, _ in timeline.steps]
    if len(times) <= _ZOOM_STEPS + 1:
        return 0.0, max(timeline.span, 1e-3)
    starts = range(len(times) - _ZOOM_STEPS)
    spans = [times[i + _ZOOM_STEPS] - times[i] for i in starts]
    usual = 2 * statistics.median(spans)
    middle = (len(times) - _ZOOM_STEPS) // 2
    first = min((i for i in starts if spans[i] <= usual), key=lambda i: abs(i - middle))
    return times[first] - 0.05, times[first + _ZOOM_STEPS] + 0.05
