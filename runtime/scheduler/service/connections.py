"""Which connection speaks for which worker: the scheduler's half of identity.

A worker is the connection it registered on (its routing id, transport/identity.py), not
the name its messages claim. This guard sits between the ROUTER and the service:

- With a run secret (always, in a scheduler process), a ``Hello`` is accepted only from a
  connection that carries the worker key of that name *for that role*
  (``wrong_key``): a worker holds the key of its own name and role, so it can neither
  take another's name nor register as another role (a generate worker as dataloader,
  to feed prompts, or as train, to announce weights). Such a Hello for a live name is
  the same worker restarted: its registration replaces the old one at once (the core
  revokes the old leases).
- Without a secret (an in-process scheduler in tests), a ``Hello`` for a name nobody
  holds binds the name to its connection; for a live name on another connection it is
  refused (``name_taken``).
- Any other request naming a worker counts only from that worker's connection
  (``wrong_sender``); one about a lease (complete, fail, lock) only for a lease that
  worker holds, so a client cannot end another's lease even with its fence.
- Bindings are soft state, like heartbeats: a name the core no longer knows (left, timed
  out) is free again. After a scheduler restart the core knows names but no connections:
  a live name is bound by the first request for it from a connection carrying its worker
  key for the role it registered. Only a run without a secret binds it by the name alone.
"""

from __future__ import annotations

import structlog

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core import SchedulerCore
from asyncrl.transport import protocol as p
from asyncrl.transport.identity import WORKER_KEY_ENV, describe, is_worker_key, name_of

__all__ = ["Connections"]

log = structlog.get_logger("asyncrl.scheduler")


class Connections:
    def __init__(self, core: SchedulerCore, run_secret: bytes | None = None) -> None:
        self._core = core
        self._secret = run_secret
        self._bound: dict[str, bytes] = {}  # worker name -> its connection's routing id

    def refusal(self, message: p.Message, sender: bytes) -> p.Error | None:
        """Why ``message`` from ``sender`` must not reach the service; None if it may."""
        claimed = getattr(message, "worker", None)
        if claimed is None:  # status, stop: about no worker
            return None
        if name_of(sender) != claimed:  # a connection speaks under its own name only
            return self._refuse(message, Reason.WRONG_SENDER, "not its connection", sender)
        if isinstance(message, p.Hello):
            return self._hello_refusal(message, sender)
        bound = self._bound.get(claimed)
        if bound is None and claimed in self._core.state.workers:
            # Live but bound to nothing: the scheduler restarted since it registered.
            role = self._core.state.workers[claimed].role
            if self._secret and not is_worker_key(sender, claimed, role, self._secret):
                why = "after a restart a live name is bound only with its worker key"
                return self._refuse(message, Reason.WRONG_SENDER, why, sender)
            log.info("worker known again by its connection", worker=claimed)
            self._bound[claimed] = bound = sender
        if bound != sender and bound is not None:
            return self._refuse(message, Reason.WRONG_SENDER, "not its connection", sender)
        lid = getattr(message, "lease_id", None)
        lease = None if lid is None else self._core.state.leases.get(lid)
        if lease is not None and lease.worker != claimed:
            return self._refuse(message, Reason.WRONG_SENDER, f"lease {lid} is not its", sender)
        return None

    def answered(self, message: p.Message, reply: p.Message, sender: bytes) -> None:
        """After the service answered: an accepted Hello binds, an accepted Bye frees."""
        if isinstance(message, p.Hello) and isinstance(reply, p.Ready):
            self._bound[message.worker] = sender
        elif isinstance(message, p.Bye) and not isinstance(reply, p.Error):
            self._bound.pop(message.worker, None)

    def forget_gone(self) -> None:
        """Free the names of workers the core dropped (timed out): anyone may take them."""
        live = self._core.state.workers
        for name in [name for name in self._bound if name not in live]:
            del self._bound[name]

    def _hello_refusal(self, m: p.Hello, sender: bytes) -> p.Error | None:
        if self._secret and not is_worker_key(sender, m.worker, m.role, self._secret):
            detail = (
                f"this connection does not carry the worker key of {m.worker!r} as "
                f"{m.role!r}: a worker registers only under its own name and role, with the "
                f"key its launcher gave it ({WORKER_KEY_ENV}) or derived from the run "
                "directory's run.secret"
            )
            return self._refuse(m, Reason.WRONG_KEY, detail, sender)
        if m.worker not in self._core.state.workers or self._bound.get(m.worker) == sender:
            return None
        if self._secret:  # it carries the name's key: the same worker, started again
            log.info("worker restarted: its new connection replaces the old", worker=m.worker)
            return None
        timeout = self._core.settings.worker_timeout
        detail = (
            f"worker name {m.worker!r} is registered on another connection: start it again "
            f"once the old registration is gone (no heartbeat for {timeout:g} s), or give "
            "it another name"
        )
        return self._refuse(m, Reason.NAME_TAKEN, detail, sender)

    def _refuse(self, m: p.Message, reason: Reason, why: str, sender: bytes) -> p.Error:
        self._core.rejections[reason] += 1
        kind, claimed, who = type(m).__name__, getattr(m, "worker", ""), describe(sender)
        log.warning("request refused", reason=str(reason), kind=kind, claimed=claimed,
                    sender=who, why=why[:200])  # fmt: skip
        if reason in (Reason.NAME_TAKEN, Reason.WRONG_KEY):
            return p.Error(reason, why)
        return p.Error(reason, f"{kind} for {claimed!r} from connection {who!r}: {why}")
