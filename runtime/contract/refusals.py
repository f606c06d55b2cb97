"""Why the scheduler refused a worker's request: part of the protocol, so workers read it
too (a worker told ``stale_fence`` drops its lease; one told ``unknown_worker`` says hello
again)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Reason"]


class Reason(StrEnum):
    """Why a command was refused. Every refusal is counted under its reason."""

    BAD_REQUEST = "bad_request"
    UNKNOWN_WORKER = "unknown_worker"
    WRONG_ROLE = "wrong_role"
    UNKNOWN_LEASE = "unknown_lease"
    STALE_FENCE = "stale_fence"
    NOT_IN_LEASE = "not_in_lease"
    INCOMPLETE_STEP = "incomplete_step"
    BAD_RESULT = "bad_result"
    BAD_VERSION = "bad_version"
    UNKNOWN_RESOURCE = "unknown_resource"
    DUPLICATE_KEY = "duplicate_key"
    # Not the core's: the daemon refuses a request that names a worker other than the
    # connection it came on (a worker speaks only for itself).
    WRONG_SENDER = "wrong_sender"
    # Nor these: a Hello for a name live on another connection (a run without a secret),
    # and a Hello from a connection without the worker key of that name and role.
    NAME_TAKEN = "name_taken"
    WRONG_KEY = "wrong_key"
