"""Who a connection is: a worker's routing id, and the run secret that proves it.

A worker's DEALER is known to the scheduler's ROUTER by its routing id, ``name/tag``. The
scheduler takes requests about a worker only from the connection that registered it, so
the routing id is the worker's identity; the name is only what it claims.

The tag is what makes the identity hard to take. A worker that holds the run's secret
(every worker ``asyncrl run`` starts, and one started by hand that can read the run
directory) uses its *worker key*, an HMAC of its name under the run secret, as the tag:
the same on every restart, so a worker killed and started again under the same name is
recognised at once (the scheduler computes the same key), and ZeroMQ's handover gives it
the old route, late replies included. A worker without the secret draws a random tag:
the scheduler then knows it by its first registration, and a restart must wait until the
old registration is gone. Either way a client that knows only a worker's name can
neither register under it nor speak for it.

Tags are credentials: nothing here logs one (:func:`describe` shows the name only), and a
worker key travels to a child in its environment, never on a command line.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

__all__ = [
    "WORKER_KEY_ENV",
    "RunSecretError",
    "connection_identity",
    "describe",
    "ensure_run_secret",
    "is_worker_key",
    "load_run_secret",
    "name_of",
    "worker_key",
]

WORKER_KEY_ENV = "ASYNCRL_WORKER_KEY"  # a child's worker key, hex, from its launcher
_SEP = "/"
_SECRET_BYTES = 32
_TAG_BYTES = 16  # of the key, in the routing id (a routing id holds at most 255 bytes)


class RunSecretError(ValueError):
    """The run secret file is unreadable, malformed or open to other users."""


def worker_key(run_secret: bytes, name: str) -> bytes:
    """The secret that proves ``name`` is one of the run's own workers."""
    return hmac.new(run_secret, b"asyncrl worker\0" + name.encode(), hashlib.sha256).digest()


def connection_identity(name: str, key: bytes | None) -> str:
    """The routing id a worker named ``name`` connects under (see the module doc)."""
    if _SEP in name:
        raise ValueError(f"worker name {name!r} contains {_SEP!r}")
    tag = key[:_TAG_BYTES].hex() if key else secrets.token_hex(_TAG_BYTES)
    return f"{name}{_SEP}{tag}"


def is_worker_key(identity: bytes, name: str, run_secret: bytes | None) -> bool:
    """Whether ``identity`` carries ``name``'s worker key under ``run_secret``."""
    if not run_secret:
        return False
    expected = connection_identity(name, worker_key(run_secret, name)).encode()
    return hmac.compare_digest(identity, expected)


def name_of(identity: bytes) -> str:
    """The worker name a routing id carries (all of it, for one without a tag)."""
    return identity.decode("utf-8", "replace").partition(_SEP)[0]


def describe(identity: bytes) -> str:
    """A routing id for a log line or an error: the name it carries, never its tag."""
    name, sep, _ = identity.decode("utf-8", "replace").partition(_SEP)
    return f"{name[:100]}{sep}…" if sep else name[:100]


def ensure_run_secret(path: Path) -> bytes:
    """The run's secret at ``path``, made (0600 from creation) if there is none yet.

    The launcher and the scheduler may both call this at once: the file appears whole by
    a hard link, which fails if another got there first, and then that one is read.
    """
    with contextlib.suppress(FileNotFoundError):
        return load_run_secret(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(secrets.token_hex(_SECRET_BYTES) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
    finally:
        draft.unlink(missing_ok=True)
    return load_run_secret(path)


def load_run_secret(path: Path) -> bytes:
    """The secret in ``path``; RunSecretError if another user could read it or it is bad.
    FileNotFoundError if there is none."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, encoding="ascii") as file:
        mode = os.fstat(file.fileno()).st_mode
        if mode & 0o077:
            raise RunSecretError(f"{path} is open to other users (mode {mode & 0o777:o}): 0600")
        text = file.read(4 * _SECRET_BYTES).strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise RunSecretError(f"{path} does not hold a run secret (hex)") from None
    if len(secret) < 16:
        raise RunSecretError(f"{path} holds a run secret of {len(secret)} bytes; 16 at least")
    return secret
