"""What a trainer publishes: which version is due, and the message that carries it.

Pure: the worker does the asking (the scheduler's status, the actor's ``on_publish``) and
the sending; these decide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncrl.transport import protocol as p

if TYPE_CHECKING:
    from asyncrl.transport.weights.base import Announcement

__all__ = ["publication", "published_version", "version_due"]


def published_version(summary: dict[str, Any], critic: bool = False) -> int | None:
    """The newest published version in the scheduler's status: the policy's, or the
    learned critic's."""
    if critic:
        return (summary.get("critic") or {}).get("version")
    return summary.get("policy_version")


def version_due(summary: dict[str, Any], critic: bool = False) -> int | None:
    """The version to publish given the scheduler's status, or None if none is due.

    The step count, when it is ahead of the published version; also the current version
    again when the scheduler holds no weights for it (it or the trainer restarted, or it
    declared the trainer lost): generators could otherwise never load it, and without
    loading it they may be too stale to generate what the next step needs.

    The critic's (``critic``) by the same rule, from its part of the status: its step
    count, published version and the weights held for its values workers.
    """
    own = (summary.get("critic") or {}) if critic else summary
    steps, published = own.get("steps_done", 0), published_version(summary, critic) or 0
    held = (own.get("weights") or {}).get("version")
    if steps < published or (steps == published and (steps == 0 or held == steps)):
        return None
    return steps


def publication(worker: str, version: int, announcement: Announcement | None) -> p.PublishVersion:
    """The PublishVersion for ``version``, with the weight plane's announcement if any."""
    if announcement is None:
        return p.PublishVersion(worker, version)
    # Imported here: only an actor that announces weights has loaded the weights module.
    from asyncrl.transport.weights.base import Announcement

    if not isinstance(announcement, Announcement):
        raise TypeError(f"on_publish returned a {type(announcement).__name__}")
    if announcement.version != version:
        raise ValueError(f"on_publish({version}) announced version {announcement.version}")
    return p.PublishVersion(worker, version, dict(announcement.manifest), announcement.address)
