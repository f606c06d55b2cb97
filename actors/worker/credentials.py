"""A worker's credentials: the routing id it connects under and the run's payload key.

Both come from the launcher (environment variables, taken out of the environment at once
so that nothing this process starts inherits them), else from the run directory's secret
when this user can read it (a worker started by hand beside its run). A worker with
neither cannot be one of the run's: it stops with what to do, before dialling anyone
(transport/identity.py says why the scheduler would refuse it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from asyncrl.runtime.contract.commands import UsageError
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport.identity import (
    PAYLOAD_KEY_ENV,
    WORKER_KEY_ENV,
    RunSecretError,
    connection_identity,
    load_run_secret,
    payload_secret,
    worker_key,
)

__all__ = ["WorkerCredentials", "worker_credentials"]


@dataclass(frozen=True, slots=True, repr=False)
class WorkerCredentials:
    routing_id: str  # name/tag, the tag from the worker key
    payload_secret: bytes  # the seed of the run's payload key pair

    def __repr__(self) -> str:
        return "WorkerCredentials(<hidden>)"


def worker_credentials(name: str, role: str, run: RunDir) -> WorkerCredentials:
    """``name``'s credentials as ``role``; UsageError naming what is missing or wrong."""
    given_key, given_payloads = (
        os.environ.pop(WORKER_KEY_ENV, ""),
        os.environ.pop(PAYLOAD_KEY_ENV, ""),
    )
    secret = b"" if given_key and given_payloads else _run_secret(run)
    key = _hex(given_key, WORKER_KEY_ENV) if given_key else worker_key(secret, name, role)
    payloads = _hex(given_payloads, PAYLOAD_KEY_ENV) if given_payloads else payload_secret(secret)
    return WorkerCredentials(connection_identity(name, key), payloads)


def _run_secret(run: RunDir) -> bytes:
    try:
        return load_run_secret(run.secret)
    except (FileNotFoundError, PermissionError):
        raise UsageError(
            f"no worker key: neither {WORKER_KEY_ENV} and {PAYLOAD_KEY_ENV} from a launcher "
            f"nor a readable {run.secret}; start workers with asyncrl run or asyncrl node, "
            "or as the run's user beside its run directory"
        ) from None
    except RunSecretError as error:
        raise UsageError(str(error)) from None


def _hex(text: str, variable: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise UsageError(f"{variable} is not a key (hex)") from None
