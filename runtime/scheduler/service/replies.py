"""The core's answers as bus replies: one form for every request module of the service."""

from __future__ import annotations

from asyncrl.runtime.scheduler.core.effects import Accepted, Rejected
from asyncrl.transport import protocol as p

__all__ = ["error_of", "reply_of"]


def error_of(rejected: Rejected) -> p.Error:
    return p.Error(rejected.reason.value, rejected.detail)


def reply_of(answer: Accepted | Rejected) -> p.Message:
    return p.Ack(answer.count) if isinstance(answer, Accepted) else error_of(answer)
