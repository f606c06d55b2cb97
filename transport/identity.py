"""Who a connection is: a worker's routing id, and the run secret that proves it.

A worker's DEALER is known to the scheduler's ROUTER by its routing id, ``name/tag``. The
scheduler takes requests about a worker only from the connection that registered it, so
the routing id is the worker's identity; the name is only what it claims.

The tag is what makes the identity hard to take, and what binds a worker to its role. A
worker's *worker key* is an HMAC of its role and name under the run secret; its first
bytes are the tag. Its launcher hands it over (every worker ``asyncrl run``, ``asyncrl
node`` and Ray start), or a worker started by hand beside its run derives it from the
run directory's secret. The scheduler, which holds the secret, registers a name only
from a connection whose tag is that name's key *for the role the Hello claims*: a
generate worker's key does not make it a dataloader (which feeds prompts) or a trainer
(which announces weights). The key is the same on every restart, so a worker killed and
started again under its name is recognised at once, and ZeroMQ's handover gives it the
old route, late replies included. A tag drawn at random (:func:`connection_identity`
without a key) is for observers, which register nothing.

A worker's launcher hands it a second secret, the *payload key*: the seed of the CurveZMQ
key pair that every payload server of the run serves and admits (security.py), the same
for every worker, so any of them fetches from any other and nobody else does.

Keys are credentials: nothing here logs one (:func:`describe` shows the name only), and
they travel to a child in its environment, never on a command line.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

__all__ = [
    "PAYLOAD_KEY_ENV",
    "WORKER_KEY_ENV",
    "RunSecretError",
    "connection_identity",
    "describe",
    "ensure_run_secret",
    "is_worker_key",
    "load_run_secret",
    "name_of",
    "payload_secret",
    "worker_env",
    "worker_key",
]

WORKER_KEY_ENV = "ASYNCRL_WORKER_KEY"  # a child's worker key, hex, from its launcher
PAYLOAD_KEY_ENV = "ASYNCRL_PAYLOAD_KEY"  # the run's payload key, hex, from the same
_SEP = "/"
_SECRET_BYTES = 32
_TAG_BYTES = 16  # of the key, in the routing id (a routing id holds at most 255 bytes)


class RunSecretError(ValueError):
    """The run secret file is unreadable, malformed or open to other users."""


def worker_key(run_secret: bytes, name: str, role: str) -> bytes:
    """The secret that proves ``name`` is one of the run's own workers, serving ``role``."""
    message = b"asyncrl worker\0" + role.encode() + b"\0" + name.encode()
    return hmac.new(run_secret, message, hashlib.sha256).digest()


def payload_secret(run_secret: bytes) -> bytes:
    """The seed of the run's payload key pair (security.payload_keys)."""
    return hmac.new(run_secret, b"asyncrl payloads", hashlib.sha256).digest()


def worker_env(run_secret: bytes, name: str, role: str) -> dict[str, str]:
    """What a launcher puts in the environment of worker ``name`` of ``role``: its worker
    key and the run's payload key (never on a command line, which any user may read)."""
    return {
        WORKER_KEY_ENV: worker_key(run_secret, name, role).hex(),
        PAYLOAD_KEY_ENV: payload_secret(run_secret).hex(),
    }


def connection_identity(name: str, key: bytes | None) -> str:
    """The routing id a worker named ``name`` connects under (see the module doc)."""
    if _SEP in name:
        raise ValueError(f"worker name {name!r} contains {_SEP!r}")
    tag = key[:_TAG_BYTES].hex() if key else secrets.token_hex(_TAG_BYTES)
    return f"{name}{_SEP}{tag}"


def is_worker_key(identity: bytes, name: str, role: str, run_secret: bytes | None) -> bool:
    """Whether ``identity`` carries the worker key of ``name`` as ``role`` under
    ``run_secret``."""
    if not run_secret:
        return False
    expected = connection_identity(name, worker_key(run_secret, name, role)).encode()
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
