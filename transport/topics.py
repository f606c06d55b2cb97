"""Event topics: one enum and one builder, so no topic string is spelled twice.

Topics are dotted: ``transition.<from>.<to>`` for every move of a group between states,
``groups.added``, ``version.published``, ``version.loaded``, ``version.rolled_back``,
``version.wanted`` (and PPO's critic's ``version.critic_published``,
``version.critic_wanted`` and ``version.critic_rolled_back``), ``lock.granted``,
``worker.lost``, ``metrics.step``, ``run.finished``, ``run.draining``, and
``wake.<worker>/`` for one waiting worker (:func:`wake_topic`).
ZeroMQ matches subscriptions by prefix, so ``transition.`` gets every move and
``version.`` every version event.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Topic", "topic", "wake_topic"]


class Topic(StrEnum):
    TRANSITION = "transition"
    GROUPS = "groups"
    VERSION = "version"
    LOCK = "lock"
    WORKER = "worker"
    METRICS = "metrics"
    RUN = "run"
    WAKE = "wake"


def topic(kind: Topic, *parts: str) -> str:
    """``topic(Topic.TRANSITION, "pending", "generating")`` → ``transition.pending.generating``."""
    for part in parts:
        if not part or "." in part:
            raise ValueError(f"topic part {part!r} must be non-empty and hold no dot")
    return ".".join((kind.value, *parts))


def wake_topic(worker: str) -> str:
    """The topic that wakes the one worker named ``worker`` (its name may hold dots).

    A worker name holds no ``/`` (transport/identity.py), so the closing ``/`` keeps
    ``generate-1`` from matching ``generate-10``'s wake-ups under prefix matching.
    """
    if not worker or "/" in worker:
        raise ValueError(f"worker name {worker!r} must be non-empty and hold no '/'")
    return f"{Topic.WAKE.value}.{worker}/"
