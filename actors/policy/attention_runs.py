"""Which rows of a decode step attend together: runs of consecutive rows, each over its own
longest prefix of the cache.

A decode step reads every row's cached keys and values up to the step's span. With one
span for all rows, a row a few tokens long reads as far as the longest row does (masked,
but read): on CPU decode attention is bound by those reads, and in a long-tail batch most
rows are far shorter than the longest. Rows laid out roughly by length (the decoder keeps
them so) split into a few runs that read little more than their own prefixes.
"""

from __future__ import annotations

__all__ = ["RUN_COST", "attention_runs"]

# What one more run costs, in cached positions of one row: an attention call and its mask
# take about as long as reading this many positions (measured on CPU for a small model:
# ~57 ns a row-position against ~50 us a call). A cut that saves less is not made.
RUN_COST = 1024

# At most 2**MAX_DEPTH runs: each split halves a run at its best cut.
MAX_DEPTH = 2


def attention_runs(spans: list[int], run_cost: int | None = None) -> list[tuple[int, int, int]]:
    """``spans`` (positions each row must see, in row order) cut into runs ``(first row,
    end row, span)`` that cover every row once, each attending over its rows' longest.
    A cut is made where it saves more than ``run_cost`` (default :data:`RUN_COST`)."""
    runs: list[tuple[int, int, int]] = []
    cost = RUN_COST if run_cost is None else run_cost
    _split(spans, 0, len(spans), MAX_DEPTH, cost, runs)
    return runs


def _split(spans: list[int], a: int, b: int, depth: int, cost: int, out: list) -> None:
    longest = max(spans[a:b])
    best, cut = (b - a) * longest, None
    if depth > 0 and b - a > 1:
        after = [0] * (b - a)  # after[i]: the longest of spans[a + i:b]
        running = 0
        for i in range(b - a - 1, -1, -1):
            running = max(running, spans[a + i])
            after[i] = running
        before = 0
        for c in range(a + 1, b):
            before = max(before, spans[c - 1])
            total = (c - a) * before + (b - c) * after[c - a] + cost
            if total < best:
                best, cut = total, c
    if cut is None:
        out.append((a, b, longest))
        return
    _split(spans, a, cut, depth - 1, cost, out)
    _split(spans, cut, b, depth - 1, cost, out)
