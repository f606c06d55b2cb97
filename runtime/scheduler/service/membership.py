"""Requests that join and leave: Hello (register), Heartbeat (renew), Bye (leave).

Each handler takes the service whose state it reads and changes (service.py holds the
state and says which handler answers which message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from asyncrl.runtime.scheduler.core.effects import Rejected
from asyncrl.transport import protocol as p

from .replies import error_of, reply_of

if TYPE_CHECKING:
    from .handler_context import HandlerContext

__all__ = ["bye", "heartbeat", "hello"]

log = structlog.get_logger("asyncrl.scheduler")


def hello(service: HandlerContext, m: p.Hello, now: float) -> p.Message:
    if m.protocol != p.PROTOCOL_VERSION:
        return p.Error(
            "protocol",
            f"worker speaks protocol {m.protocol}; this scheduler speaks "
            f"{p.PROTOCOL_VERSION}: install the same asyncrl version on both sides",
        )
    reply = service.core.register(m.worker, m.role, now)
    if isinstance(reply, Rejected):
        return error_of(reply)
    service.live_stores.pop(m.worker, None)  # a new process: its store is not known yet
    # Nor does it serve what its predecessor announced or relayed (that address may be
    # dead): a publisher that registers announces its version again (worker/versions.py).
    service.routes.forget(m.worker)
    service.critic_routes.forget(m.worker)
    log.info("worker registered", worker=m.worker, role=m.role, pid=m.pid)
    settings = service.core.settings
    return p.Ready(
        m.worker,
        service.run_name,
        p.PROTOCOL_VERSION,
        service.heartbeat_interval_s,
        settings.lease_timeout,
        service.max_message_bytes,
        service.core.state.policy_version,
        service.core.state.steps_done,
        service.core.state.critic_version,
        service.core.state.critic_steps_done,
    )


def heartbeat(service: HandlerContext, m: p.Heartbeat, now: float) -> p.Message:
    held = None if m.leases is None else list(m.leases)
    return reply_of(service.core.heartbeat(m.worker, now, held))


def bye(service: HandlerContext, m: p.Bye, _now: float) -> p.Message:
    log.info("worker left", worker=m.worker, reason=m.reason)
    # on purpose: whatever it held goes back with no try counted against it
    return reply_of(service.core.worker_lost(m.worker, f"left: {m.reason}", died=False))
