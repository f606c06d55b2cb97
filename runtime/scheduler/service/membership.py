"""Requests that join and leave: Hello (register), Heartbeat (renew), Bye (leave).

The handlers are :class:`Membership`'s methods, given what they read and change
(service.py builds it and says which handler answers which message).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from asyncrl.runtime.scheduler.core.effects import Rejected
from asyncrl.runtime.scheduler.core.scheduler import SchedulerCore
from asyncrl.transport import protocol as p

from .payload_refs import PayloadStores
from .replies import error_of, reply_of
from .weight_routes import WeightRoutes

__all__ = ["Membership", "ReadyTerms"]

log = structlog.get_logger("asyncrl.scheduler")


@dataclass(frozen=True, slots=True)
class ReadyTerms:
    """What a Ready tells a registered worker of the run, beside the core's versions."""

    run_name: str
    heartbeat_interval_s: float
    max_message_bytes: int


class Membership:
    """Hello, Heartbeat and Bye, given the core, the terms a Ready states, the payload
    stores and the weights' routes (neither of which a new process serves yet)."""

    def __init__(
        self,
        core: SchedulerCore,
        terms: ReadyTerms,
        payloads: PayloadStores,
        routes: WeightRoutes,
        critic_routes: WeightRoutes,
    ) -> None:
        self.core = core
        self.terms = terms
        self.payloads = payloads
        self.routes = routes
        self.critic_routes = critic_routes

    def hello(self, m: p.Hello, now: float) -> p.Message:
        if m.protocol != p.PROTOCOL_VERSION:
            return p.Error(
                "protocol",
                f"worker speaks protocol {m.protocol}; this scheduler speaks "
                f"{p.PROTOCOL_VERSION}: install the same asyncrl version on both sides",
            )
        reply = self.core.register(m.worker, m.role, now)
        if isinstance(reply, Rejected):
            return error_of(reply)
        self.payloads.live.pop(m.worker, None)  # a new process: its store is not known yet
        # Nor does it serve what its predecessor announced or relayed (that address may be
        # dead): a publisher that registers announces its version again (worker/versions.py).
        self.routes.forget(m.worker)
        self.critic_routes.forget(m.worker)
        log.info("worker registered", worker=m.worker, role=m.role, pid=m.pid)
        settings = self.core.settings
        terms = self.terms
        return p.Ready(
            m.worker,
            terms.run_name,
            p.PROTOCOL_VERSION,
            terms.heartbeat_interval_s,
            settings.lease_timeout,
            terms.max_message_bytes,
            self.core.state.policy_version,
            self.core.state.steps_done,
            self.core.state.critic_version,
            self.core.state.critic_steps_done,
        )

    def heartbeat(self, m: p.Heartbeat, now: float) -> p.Message:
        held = None if m.leases is None else list(m.leases)
        return reply_of(self.core.heartbeat(m.worker, now, held))

    def bye(self, m: p.Bye, _now: float) -> p.Message:
        log.info("worker left", worker=m.worker, reason=m.reason)
        # on purpose: whatever it held goes back with no try counted against it
        return reply_of(self.core.worker_lost(m.worker, f"left: {m.reason}", died=False))
