"""The version and weights requests: PublishVersion (a trainer, or PPO's critic, announces
a version, and the weights to route), WantWeights (whom a receiver fetches from:
weight_routes.py; a values worker fetches the critic's), LoadedVersion (a generator runs
a version, and may claim its next work with it: lease_requests.claim_along), Rewind
(training rolls back to a step).

The policy's versions and the critic's each have their own routes (``service.routes``,
``service.critic_routes``): the publisher's role says which a publication goes to, the
asker's role which a WantWeights is answered from.

Each handler takes the service whose state it reads and changes (service.py holds the
state and says which handler answers which message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core.effects import Accepted, Rejected
from asyncrl.transport import protocol as p
from asyncrl.transport.topics import Topic, topic

from .lease_requests import bad_claim_next, claim_along
from .replies import reply_of
from .weight_routes import NoRoute, WeightRoutes

if TYPE_CHECKING:
    from .handler_context import HandlerContext

__all__ = ["loaded", "publish", "rewind", "want_weights"]

log = structlog.get_logger("asyncrl.scheduler")

_NAMES_LOGGED = 8  # manifest keys named in a log line; the manifest itself can be large


def publish(service: HandlerContext, m: p.PublishVersion, now: float) -> p.Message:
    bad = _bad_announcement(m)
    if bad is not None:
        log.warning("bad publication", worker=m.worker, version=m.version, detail=bad)
        return p.Error(Reason.BAD_REQUEST, bad)
    reply = service.core.publish_version(m.worker, m.version)
    known = service.core.state.workers.get(m.worker)
    # The core took it from a publisher: the trainer, or (any other role) the critic.
    critic = known is not None and known.role != service.step_role
    if _announces_again(m, _published(service, critic), reply):
        # The current version's weights, offered again after a restart: nothing for the
        # core (versions only go forward), the routes take the new announcement.
        reply = Accepted()
    if isinstance(reply, Accepted):
        if not critic:  # the critic's versions are on no train step's critical path
            service.path.published(m.version, now)
            service.trace.published(m.worker, m.version, now)
        _routes(service, critic).announce(m.version, m.worker, m.weights, m.address)
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


def rewind(service: HandlerContext, m: p.Rewind, _now: float) -> p.Message:
    reply = service.core.rewind(m.worker, m.step)
    if isinstance(reply, Rejected):
        log.error("rollback refused", worker=m.worker, step=m.step, detail=reply.detail)
    return reply_of(reply)


def want_weights(service: HandlerContext, m: p.WantWeights, _now: float) -> p.Message:
    if m.worker not in service.core.state.workers:  # its own code: the worker registers again
        return p.Error(Reason.UNKNOWN_WORKER, f"worker {m.worker!r} is not registered")
    # A worker that follows the critic's versions (values) fetches the critic's weights.
    critic = service.core.state.workers[m.worker].role in service.core.state.critic_followers
    try:
        if m.version < 0:
            raise ValueError(f"version {m.version} is negative (0 asks for the newest)")
        route = _routes(service, critic).route(m.worker, m.version, m.address, m.failed)
    except ValueError as bad:
        log.warning("bad weights request", worker=m.worker, version=m.version, detail=str(bad))
        return p.Error(Reason.BAD_REQUEST, str(bad))
    except NoRoute as none:
        log.info("no weights route", worker=m.worker, version=m.version, detail=none.detail)
        _want_announcement(service, critic)
        return p.Error(none.code, none.detail)
    if m.failed:
        log.warning("weights source failed", worker=m.worker, failed=m.failed)
    # One per follower per version: at a thousand workers, info would be most of the log
    # (and a burst of lines after each publication); the trace and weight_loads.jsonl say
    # who loaded what from whom.
    log.debug("weights route", worker=m.worker, version=route.version, source=route.source)
    return p.WeightsPlan(route.version, route.manifest, route.source, route.source_address)


def _want_announcement(service: HandlerContext, critic: bool) -> None:
    """A receiver found no weights for the published version: this scheduler was restarted
    since the trainer (or the critic) announced them (announcements are not journaled).
    The publisher hears this event and announces them again; it also checks now and then,
    as events may drop."""
    published = _published(service, critic)
    if published > 0 and _routes(service, critic).newest != published:
        name = topic(Topic.VERSION, "critic_wanted" if critic else "wanted")
        service.emit(name, {"version": published})


def _routes(service: HandlerContext, critic: bool) -> WeightRoutes:
    """The routes of the policy's versions, or of the learned critic's."""
    return service.critic_routes if critic else service.routes


def _published(service: HandlerContext, critic: bool) -> int:
    state = service.core.state
    return state.critic_version if critic else state.policy_version


def loaded(service: HandlerContext, m: p.LoadedVersion, now: float) -> p.Message:
    refused = bad_claim_next(m.claim_next)
    if refused is not None:
        return refused
    taken = reply_of(service.core.loaded_version(m.worker, m.version))
    if not isinstance(taken, p.Ack):
        return taken
    service.trace.loaded(m.worker, m.version, now)
    everywhere = _loaded_by_every_generator(service)
    if everywhere is not None:
        service.path.loaded_everywhere(everywhere, now)
    if not m.claim_next:
        return taken
    role = service.core.state.workers[m.worker].role
    return claim_along(service, m.worker, role, m.claim_next, taken, now)


def _loaded_by_every_generator(service: HandlerContext) -> int | None:
    """The newest version every registered generator runs (or a newer one), if any."""
    loaded = service.core.state.indexes.versions.get(service.generator_role)
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
