"""Journal records: the facts the core has decided, one opcode each.

The core decides (which groups to lease, whether a completion is valid, who dies) and then
*applies* a record; applying is the only way its state changes. Replaying the same records
on a fresh core therefore rebuilds the same state, and a record states what happened, not
what was asked, so replay never re-runs a decision.

A payload is what a role produced for a group (a prompt, tokens, rewards), opaque to the
core: what the scheduler keeps of it (small bytes, or a reference to the worker keeping
it) is kept with the group under the role's name, handed to the next stages with their
leases, journaled with the completion that produced it, and forgotten when the group is
trained. So data that reached ``generated`` is never generated again, unless the worker
keeping it is lost before every stage took it (LOSE).

Records are plain tuples so that they cost little on the hot path and pack straight into
MessagePack; they come back from the journal as lists, which ``apply`` accepts too.

========  ==============================================================================
opcode    fields after the opcode
========  ==============================================================================
REGISTER  worker, role
LEAVE     worker                                (its leases have already been failed)
LOADED    worker, version
ADD       first_gid, keys, data               (new groups in ``entry``, gids in order;
                                                data: one payload per key, or None)
LEASE     lid, fence, role, source, worker, lease_deadline, gids, version, step_deadline
RENEW     lids, lease_deadline
COMPLETE  lid, gids, behaviour, data         (behaviour: [[vmin, vmax], ...] or None;
                                                data: one payload per gid, or None)
FAIL      lid, gids, reason[, counted]           (back to the source; attempt + 1 unless
                                                counted is false: given back for another's
                                                fault, a payload lost upstream)
KILL      gids, reason                          (to ``dead``, out of any lease)
PUBLISH   version
GRANT     resource, lid, token                  (a lock taken under a lease)
WAIT      resource, lid                         (queued for a full resource)
UNLOCK    resource, token
RESUME    epoch                                 (restart: fences and lease ids jump ahead)
LOSE      lid, gid, role, reason                (role's payload of gid is gone: out of the
                                                lease, back before the stage that made it,
                                                what was derived from it dropped)
========  ==============================================================================
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Op"]


class Op(IntEnum):
    REGISTER = 1
    LOADED = 2
    ADD = 3
    LEASE = 4
    RENEW = 5
    COMPLETE = 6
    FAIL = 7
    KILL = 8
    PUBLISH = 9
    GRANT = 10
    WAIT = 11
    UNLOCK = 12
    LEAVE = 13
    RESUME = 14
    LOSE = 15
