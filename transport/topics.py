"""Event topics: one enum and one builder, so no topic string is spelled twice.

Topics are dotted: ``transition.<from>.<to>`` for every move of a group between states,
``groups.added``, ``version.published``, ``version.loaded``, ``version.rolled_back``,
``version.wanted``, ``lock.granted``, ``worker.lost``, ``metrics.step``, ``run.finished``,
``run.draining``.
ZeroMQ matches subscriptions by prefix, so ``transition.`` gets every move and
``version.`` every version event.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Topic", "topic"]


class Topic(StrEnum):
    TRANSITION = "transition"
    GROUPS = "groups"
    VERSION = "version"
    LOCK = "lock"
    WORKER = "worker"
    METRICS = "metrics"
    RUN = "run"


def topic(kind: Topic, *parts: str) -> str:
    """``topic(Topic.TRANSITION, "pending", "generating")`` → ``transition.pending.generating``."""
    for part in parts:
        if not part or "." in part:
            raise ValueError(f"topic part {part!r} must be non-empty and hold no dot")
    return ".".join((kind.value, *parts))
