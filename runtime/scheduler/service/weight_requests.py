"""The version and weights requests: PublishVersion (a trainer, or PPO's critic, announces
a version, and the weights to route), WantWeights (whom a receiver fetches from:
weight_routes.py; a values worker fetches the critic's), LoadedVersion (a generator runs
a version, and may claim its next work with it: lease_requests.claim_along), Rewind
(training rolls back to a step).

The policy's versions and the critic's each have their own routes (``routes``,
``critic_routes``): the publisher's role says which a publication goes to, the asker's
role which a WantWeights is answered from.

The handlers are :class:`WeightRequests`'s methods, given what they read and change
(service.py builds it and says which handler answers which message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import Gate
from asyncrl.runtime.scheduler.core.effects import Accepted, Rejected
from asyncrl.runtime.scheduler.core.scheduler import SchedulerCore
from asyncrl.transport import protocol as p
from asyncrl.transport.topics import Topic, topic

from .lease_requests import LeaseRequests, bad_claim_next
from .replies import reply_of
from .step_path import StepPath
from .trace import Trace
from .weight_routes import NoRoute, WeightRoutes

__all__ = ["WeightRequests"]

log = structlog.get_logger("asyncrl.scheduler")

_NAMES_LOGGED = 8  # manifest keys named in a log line; the manifest itself can be large


class WeightRequests:
    """PublishVersion, WantWeights, LoadedVersion and Rewind, given the core, the routes of
    the policy's and the critic's weights, what a version is noted in, and the lease
    handlers (for the claim a LoadedVersion carries)."""

    def __init__(
        self,
        core: SchedulerCore,
        routes: WeightRoutes,
        critic_routes: WeightRoutes,
        path: StepPath,
        trace: Trace,
        emit: Callable[[str, dict[str, Any]], None],
        leases: LeaseRequests,
    ) -> None:
        self.core = core
        self.routes = routes
        self.critic_routes = critic_routes
        self.path = path
        self.trace = trace
        self.emit = emit
        self.leases = leases
        self.step_role = core.pipeline.gated(Gate.STEP).role
        self.generator_role = core.pipeline.gated(Gate.ADMIT).role

    def publish(self, m: p.PublishVersion, now: float) -> p.Message:
        bad = _bad_announcement(m)
        if bad is not None:
            log.warning("bad publication", worker=m.worker, version=m.version, detail=bad)
            return p.Error(Reason.BAD_REQUEST, bad)
        reply = self.core.publish_version(m.worker, m.version)
        known = self.core.state.workers.get(m.worker)
        # The core took it from a publisher: the trainer, or (any other role) the critic.
        critic = known is not None and known.role != self.step_role
        if _announces_again(m, self._published(critic), reply):
            # The current version's weights, offered again after a restart: nothing for the
            # core (versions only go forward), the routes take the new announcement.
            reply = Accepted()
        if isinstance(reply, Accepted):
            if not critic:  # the critic's versions are on no train step's critical path
                self.path.published(m.version, now)
                self.trace.published(m.worker, m.version, now)
            self._routes(critic).announce(m.version, m.worker, m.weights, m.address)
            if m.weights is not None:
                log.info(
                    "weights announced",
                    version=m.version,
                    publisher=m.worker,
                    critic=critic,
                    manifest_bytes=len(p.pack_payload(m.weights)),
                    manifest_keys=sorted(m.weights)[:_NAMES_LOGGED],
                    address_bytes=len(m.address),
                )
        return reply_of(reply)

    def rewind(self, m: p.Rewind, _now: float) -> p.Message:
        reply = self.core.rewind(m.worker, m.step)
        if isinstance(reply, Rejected):
            log.error("rollback refused", worker=m.worker, step=m.step, detail=reply.detail)
        return reply_of(reply)

    def want_weights(self, m: p.WantWeights, _now: float) -> p.Message:
        if m.worker not in self.core.state.workers:  # its own code: the worker registers again
            return p.Error(Reason.UNKNOWN_WORKER, f"worker {m.worker!r} is not registered")
        # A worker that follows the critic's versions (values) fetches the critic's weights.
        critic = self.core.state.workers[m.worker].role in self.core.state.critic_followers
        try:
            if m.version < 0:
                raise ValueError(f"version {m.version} is negative (0 asks for the newest)")
            route = self._routes(critic).route(m.worker, m.version, m.address, m.failed)
        except ValueError as bad:
            log.warning("bad weights request", worker=m.worker, version=m.version, detail=str(bad))
            return p.Error(Reason.BAD_REQUEST, str(bad))
        except NoRoute as none:
            log.info("no weights route", worker=m.worker, version=m.version, detail=none.detail)
            self._want_announcement(critic)
            return p.Error(none.code, none.detail)
        if m.failed:
            log.warning("weights source failed", worker=m.worker, failed=m.failed)
        # One per follower per version: at a thousand workers, info would be most of the log
        # (and a burst of lines after each publication); the trace and weight_loads.jsonl say
        # who loaded what from whom.
        log.debug("weights route", worker=m.worker, version=route.version, source=route.source)
        return p.WeightsPlan(route.version, route.manifest, route.source, route.source_address)

    def _want_announcement(self, critic: bool) -> None:
        """A receiver found no weights for the published version: this scheduler was restarted
        since the trainer (or the critic) announced them (announcements are not journaled).
        The publisher hears this event and announces them again; it also checks now and then,
        as events may drop."""
        published = self._published(critic)
        if published > 0 and self._routes(critic).newest != published:
            name = topic(Topic.VERSION, "critic_wanted" if critic else "wanted")
            self.emit(name, {"version": published})

    def _routes(self, critic: bool) -> WeightRoutes:
        """The routes of the policy's versions, or of the learned critic's."""
        return self.critic_routes if critic else self.routes

    def _published(self, critic: bool) -> int:
        state = self.core.state
        return state.critic_version if critic else state.policy_version

    def loaded(self, m: p.LoadedVersion, now: float) -> p.Message:
        refused = bad_claim_next(m.claim_next)
        if refused is not None:
            return refused
        taken = reply_of(self.core.loaded_version(m.worker, m.version))
        if not isinstance(taken, p.Ack):
            return taken
        self.trace.loaded(m.worker, m.version, now)
        everywhere = self._loaded_by_every_generator()
        if everywhere is not None:
            self.path.loaded_everywhere(everywhere, now)
        if not m.claim_next:
            return taken
        role = self.core.state.workers[m.worker].role
        return self.leases.claim_along(m.worker, role, m.claim_next, taken, now)

    def _loaded_by_every_generator(self) -> int | None:
        """The newest version every registered generator runs (or a newer one), if any."""
        loaded = self.core.state.indexes.versions.get(self.generator_role)
        if not loaded or None in loaded:
            return None
        return min(v for v in loaded if v is not None)


def _announces_again(m: p.PublishVersion, published: int, reply: object) -> bool:
    """A publisher's repeat of its current version, carrying its weights: welcome."""
    return (
        isinstance(reply, Rejected)
        and reply.reason == Reason.BAD_VERSION
        and m.weights is not None
        and m.version == published
    )


def _bad_announcement(m: p.PublishVersion) -> str | None:
    """Why a publication's weight-plane fields make no sense, if they do not."""
    if m.weights is not None and not isinstance(m.weights, dict):
        return f"weights of version {m.version} must be a manifest dict, not {type(m.weights)}"
    if m.address and m.weights is None:
        return f"version {m.version} names a weight-plane address but carries no manifest"
    return None
