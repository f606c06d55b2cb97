"""A training group: N processes in one ``torch.distributed`` group, led by rank 0.

The scheduler leases a train batch to the group as one gang: it only ever sees rank 0
(the *leader*), which registers, claims, heartbeats and publishes like any worker. The
other ranks (*followers*) never talk to the scheduler; they take their orders from the
leader through the group's key-value store (transport/group_store.py: the leader serves
it on the group's address, over CURVE with keys from the run secret) and then meet it in
the collectives of the order: a train step, a checkpoint, the end.

Every rank or none: an order's collectives need every rank, so a rank that dies or hangs
makes the others' collectives fail (a closed connection at once, a hang after
``timeout_s``). Each rank then exits with :class:`GangBroken`; the leader's lease goes
back to the scheduler unfinished, and the supervisor starts the whole group again, which
meet afresh and take up the state every rank staged after the last step.

Where the group meets is given by three environment variables (set by ``asyncrl run``,
or by ``asyncrl-worker --rank R --ranks N --rendezvous HOST:PORT`` on other hosts):
``ASYNCRL_GANG_RANK``, ``ASYNCRL_GANG_SIZE`` and ``ASYNCRL_GANG_ADDR`` (the leader's
``HOST:PORT``; the port is fresh for every start of the group). A group whose ranks
several machines start (``asyncrl node --roles train@1``) is given no address: its leader
announces one in the run directory and the others read it there (runtime/contract/
gangs.py). Every rank reads the run secret (``RUN_DIR/run.secret``): without it a rank
cannot join.

A group whose address is loopback is on one machine: its store, and gloo's and NCCL's own
sockets, are on the loopback interface. A group across machines meets on the address
given; its store is authenticated and encrypted, but gloo's and NCCL's connections
between the machines are neither (torch offers no way to): such a group belongs on a
network only the run's machines reach.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import NoReturn, TypeVar

import msgpack
import structlog

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.gangs import GangPlace
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport import protocol as p
from asyncrl.transport.group_store import GroupStoreError, Limits, StoreTimeout
from asyncrl.transport.identity import RunSecretError, load_run_secret

from ..actor import ActorBroken

__all__ = [
    "Gang",
    "GangBroken",
    "Order",
    "end_process",
    "join_group",
    "join_group_at",
    "pack_lease",
    "unpack_lease",
]

log = structlog.get_logger("asyncrl.gang")

T = TypeVar("T")
_POLL_S = 1.0  # a follower waiting for an order checks this often that the leader lives


class GangBroken(ActorBroken):
    """A rank of the group is gone or stuck: this process must exit and start afresh."""


class Order(enum.StrEnum):
    """What the leader asks the followers to join in."""

    STEP = "step"  # train on a lease (the body: the lease's frames)
    RESTORE = "restore"  # take up the state for a step count (the body: the count)
    SCORE = "score"  # score a lease's responses, each rank its share of the rows
    LOAD = "load"  # take new weights, whole from the leader, each rank its shard
    FETCH = "fetch"  # fetch this rank's rows of a version in parts (body: the plan)
    FETCHED = "fetched"  # say whether this rank's rows arrived (a collective)
    GATHER = "gather"  # gather the full weights and optimizer state on the leader
    STOP = "stop"  # the leader is leaving; so do the followers, with exit status 0


class Gang:
    """This process's membership: rendezvous, orders (leader → followers), leaving."""

    def __init__(
        self,
        place: GangPlace,
        *,
        secret: bytes,
        backend: str = "gloo",
        timeout_s: float = 300.0,
        limits: Limits | None = None,
        meeting: Path | None = None,
    ):
        import torch.distributed as dist  # only group members pay for importing torch

        from .dist_store import join_store, on_loopback

        self.place = place
        self.rank, self.size = place.rank, place.size
        timeout = timedelta(seconds=timeout_s)
        if on_loopback(place.host):
            _keep_collectives_on_loopback()
        try:
            self._server, self._store = join_store(
                place, secret, timeout_s, limits, meeting=meeting
            )
            dist.init_process_group(
                backend, store=self._store, rank=place.rank, world_size=place.size, timeout=timeout
            )
        except (RuntimeError, dist.DistError) as error:
            raise GangBroken(f"rank {place.rank} could not join its group: {error}") from error
        self._sent = 0  # orders given (leader) or taken (follower)
        self.broken = False  # a collective failed: the group's ranks no longer agree
        log.info("joined the training group", rank=place.rank, size=place.size)

    # --- leader ----------------------------------------------------------------------

    def lead(self, order: Order, work: Callable[[], T], body: bytes = b"") -> T:
        """Order the followers into ``order`` and do this rank's part of it (``work``).

        Any failure breaks the group: a rank is gone or stuck, or one rank failed where
        the others did not, so the ranks no longer hold one state. GangBroken, and from
        then on the group only exits (:meth:`leave` orders nothing).
        """
        try:
            self.order(order, body)
            return work()
        except Exception as error:
            self.broken = True
            raise GangBroken(f"the group broke during {order}: {error}") from error

    def leave(self) -> None:
        """The leader is leaving: the followers stop too (unless the group is broken)."""
        if not self.broken:
            self.order(Order.STOP)
            self.close()

    def order(self, order: Order, body: bytes = b"") -> None:
        """Tell every follower to join in ``order`` (the leader only)."""
        if not self.place.leads:
            raise RuntimeError("only rank 0 gives orders")
        try:
            value = msgpack.packb([order.value, body])
            self._store.client.call("set", _order_key(self._sent), value)
            if self._sent >= 2:
                # Every follower has read it: they have since met in the order after it.
                self._store.client.call("delete", _order_key(self._sent - 2))
        except GroupStoreError as error:
            raise GangBroken(f"the group's store failed: {error}") from error
        self._sent += 1

    # --- followers -------------------------------------------------------------------

    def next_order(self) -> tuple[Order, bytes]:
        """Wait for the leader's next order; GangBroken when the leader is gone."""
        key = _order_key(self._sent)
        while True:
            try:
                value = self._store.client.call("get", [key], _POLL_S, waits_s=_POLL_S)
                break
            except StoreTimeout:
                continue  # the leader lives (it answered) and has no order yet
            except GroupStoreError as error:
                raise GangBroken(f"the leader's store is gone: {error}") from error
        kind, body = _order_of(value)
        self._sent += 1
        return kind, body

    # --- everyone --------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group. The leader serves the group's store, so it goes last: it waits
        (5 s at most: a follower may be gone already) until every follower has said it
        leaves, the last thing a follower asks of the store. The process should then end
        with :func:`end_process`."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        client = self._store.client
        try:
            if self.place.leads:
                left = [_left_key(rank) for rank in range(1, self.size)]
                client.call("wait", left, 5.0, waits_s=5.0)
            else:
                client.call("set", _left_key(self.rank), b"")
        except GroupStoreError:
            pass  # a follower that never says, or a leader already gone: leave anyway
        client.close()
        if self._server is not None:
            self._server.close()


def _order_of(value: object) -> tuple[Order, bytes]:
    """An order as the store holds it; GangBroken for anything else (only a rank with the
    run secret can write there, so this is a bug, never a stranger)."""
    try:
        kind, body = msgpack.unpackb(value)
        if not isinstance(body, bytes):
            raise TypeError(f"an order's body is {type(body).__name__}")
        return Order(kind), body
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise GangBroken(f"the leader's order does not read: {error}") from error


def _keep_collectives_on_loopback() -> None:
    """gloo and NCCL listen on the interface these name (by default, the one the host's
    name resolves to): a group on one machine keeps them to loopback."""
    from .dist_store import loopback_interface

    interface = loopback_interface()
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ["NCCL_SOCKET_IFNAME"] = interface


def end_process(code: int) -> NoReturn:
    """End a group rank's process at once with exit status ``code``, skipping the
    interpreter's teardown. Call it once the group is closed and the rank's work is
    written; it flushes the output and the logs.

    A sharded model holds its process group after ``destroy_process_group`` (its sharded
    tensors and torch's caches of their layouts refer to it), so gloo's worker threads
    live on into the interpreter's teardown. A worker that drops the last reference to a
    finished collective's tensors must take the GIL to free them. If it asks while the
    main thread holds the GIL and then starts finalizing, Python ends that worker thread
    by unwinding it through torch's C++ destructors, and the process aborts ("terminate
    called without an active exception"). It struck about one group in fifty whose
    ranks exited right after their last collective, on a busy 2-core machine;
    tests/integration/test_gang_exit.py provokes it (every time on an idle machine).
    Without the teardown there is no finalizing interpreter for such a thread to meet.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to say
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _order_key(seq: int) -> str:
    return f"asyncrl/order/{seq}"


def _left_key(rank: int) -> str:
    return f"asyncrl/left/{rank}"


def join_group(cfg: RunConfig, role: str) -> Gang | None:
    """The group of ``role``'s ranks the environment places this process in; None for a
    worker on its own."""
    place = GangPlace.from_env()
    if place is None or place.size == 1:
        return None
    return join_group_at(cfg, place, role)


def join_group_at(cfg: RunConfig, place: GangPlace, role: str = "") -> Gang:
    """Join ``role``'s group at ``place`` with the run's secret; GangBroken without one.
    A group that meets where its leader announces (``place.announced``) needs ``role``:
    the announcement is the role's file in the run directory."""
    backend = "nccl" if cfg.backends.device == "cuda" else "gloo"  # within the group only
    path = RunDir.of(cfg).secret
    try:
        secret = load_run_secret(path)
    except (OSError, RunSecretError) as error:
        raise GangBroken(
            f"a rank of a group needs the run secret ({path}) to meet the others: {error}"
        ) from error
    if place.announced and not role:
        raise ValueError("a group whose leader announces its address needs its role")
    return Gang(
        place,
        secret=secret,
        backend=backend,
        timeout_s=cfg.backends.collective_timeout_s,
        limits=Limits.for_messages(cfg.scheduler.max_message_mb << 20),
        meeting=RunDir.of(cfg).group_leader(role) if place.announced else None,
    )


def pack_lease(lease: p.Lease) -> bytes:
    """A lease as one order body: its protocol frames (arrays as raw bytes), never pickled."""
    return msgpack.packb([bytes(frame) for frame in p.encode(lease)])


def unpack_lease(body: bytes) -> p.Lease:
    lease = p.decode(msgpack.unpackb(body))
    if not isinstance(lease, p.Lease):
        raise ValueError(f"an order carries a {type(lease).__name__}, not a Lease")
    return lease
