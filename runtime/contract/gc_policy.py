"""Garbage-collector settings for long-running processes, applied once start-up is over.

CPython's cyclic collector scans every tracked object of a generation when it runs. A
full collection walks everything start-up created too (modules, numpy, zmq, structlog,
the config): about 20 ms in the scheduler on a 2-core VM, a pause that lands on whichever
request is in flight. Nothing made at start-up becomes cyclic garbage later, so
:func:`settle_after_startup` moves it out of the collector's sight (``gc.freeze``); the
collector then scans only what the process made since. The bus's per-request objects die
by reference count, so a larger first generation only makes the cheap young collections
rarer; collections still run, so real cycles are still reclaimed.
"""

from __future__ import annotations

import gc

__all__ = ["THRESHOLDS", "settle_after_startup"]

# (young, middle, old): a young collection per 10,000 net new container objects instead
# of 700; the older generations keep their default ratios.
THRESHOLDS = (10_000, 10, 10)


def settle_after_startup() -> None:
    """Collect start-up's garbage, freeze what remains, and raise the young threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
