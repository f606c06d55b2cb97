"""The routing id this worker connects under: its name and, where it can, its worker key.

The key comes from the launcher (an environment variable, taken out of the environment at
once so that nothing this process starts inherits it), else from the run directory's
secret when this user can read it (a worker started by hand beside its run). Without
either, the worker connects under a random tag and cannot replace a live registration of
its name (transport/identity.py says why).
"""

from __future__ import annotations

import os

from asyncrl.runtime.cli.common import UsageError
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport.identity import (
    WORKER_KEY_ENV,
    RunSecretError,
    connection_identity,
    load_run_secret,
    worker_key,
)

__all__ = ["worker_identity"]


def worker_identity(name: str, run: RunDir) -> str:
    """``name``'s routing id; UsageError for a key or secret file that is not right."""
    given = os.environ.pop(WORKER_KEY_ENV, None)
    if given:
        try:
            key = bytes.fromhex(given)
        except ValueError:
            raise UsageError(f"{WORKER_KEY_ENV} is not a worker key (hex)") from None
        return connection_identity(name, key)
    try:
        key = worker_key(load_run_secret(run.secret), name)
    except (FileNotFoundError, PermissionError):
        key = None  # not this run's host, or not its user: a random tag
    except RunSecretError as error:
        raise UsageError(str(error)) from None
    return connection_identity(name, key)
