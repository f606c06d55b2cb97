"""CurveZMQ keys: made by ``asyncrl-scheduler keygen DIR``, loaded by scheduler and workers.

A key directory holds two key pairs as ZPL certificates (the text format of ZeroMQ's own
``zmq.auth`` tools, so those can read them too)::

    server.key          the scheduler's public key: every worker needs it
    server.key_secret   the scheduler's key pair
    client.key          the workers' public key: the scheduler lets only it in
    client.key_secret   the workers' key pair

Every file is created with mode 0600 in one step (never loosened first and tightened after)
and keygen never overwrites a key. Loaded keys are raw z85 text, as libzmq's CURVE options
take them; a secret key never shows in a repr.

The bus is under CURVE on every TCP endpoint, loopback included: a port on 127.0.0.1 is
open to every user of the machine. Only ``ipc://`` sockets go without, in a directory
only the run's user can open. The data plane's key pair is not in the directory: it is
derived from the run secret (:func:`payload_keys`), and every payload socket uses it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import zmq
from zmq.utils import z85

__all__ = [
    "CLIENT_PUBLIC",
    "CLIENT_SECRET",
    "SERVER_PUBLIC",
    "SERVER_SECRET",
    "ClientKeys",
    "CurveMode",
    "KeyFileError",
    "ServerKeys",
    "curve_required",
    "ensure_keys",
    "is_loopback",
    "keygen",
    "load_client_keys",
    "load_server_keys",
    "payload_keys",
]

SERVER_PUBLIC = "server.key"
SERVER_SECRET = "server.key_secret"
CLIENT_PUBLIC = "client.key"
CLIENT_SECRET = "client.key_secret"

CurveMode = Literal["auto", "on", "off"]

_KEY_LINE = re.compile(r'^\s*(public|secret)-key\s*=\s*"([^"]*)"\s*$')
_PUBLIC_BANNER = "#   asyncrl CurveZMQ public key: may be copied to every worker host.\n"
_SECRET_BANNER = "#   asyncrl CurveZMQ SECRET key: keep it private; never share or commit it.\n"


class KeyFileError(ValueError):
    """A key file is missing or malformed; the message names it and how to make keys."""


@dataclass(frozen=True, slots=True, repr=False)
class ServerKeys:
    """The scheduler's key pair and the public keys of the clients it lets in (z85)."""

    public: bytes
    secret: bytes
    clients: frozenset[bytes]

    def __repr__(self) -> str:
        return f"ServerKeys(public={self.public!r}, secret=<hidden>, clients={len(self.clients)})"


@dataclass(frozen=True, slots=True, repr=False)
class ClientKeys:
    """A worker's key pair and the scheduler's public key it expects to talk to (z85)."""

    public: bytes
    secret: bytes
    server_public: bytes

    def __repr__(self) -> str:
        return (
            f"ClientKeys(public={self.public!r}, secret=<hidden>, "
            f"server_public={self.server_public!r})"
        )


def keygen(directory: Path) -> None:
    """Write a new server and client key pair into ``directory`` (made 0700 if missing).

    Refuses, before writing anything, if any of the four key files already exists.
    """
    directory = Path(directory)
    names = (SERVER_PUBLIC, SERVER_SECRET, CLIENT_PUBLIC, CLIENT_SECRET)
    for name in names:
        if (directory / name).exists():
            raise FileExistsError(
                f"{directory / name} already exists; keygen never overwrites keys "
                "(move the old ones away first if you mean to replace them)"
            )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for stem in ("server", "client"):
        public, secret = zmq.curve_keypair()
        _write_private(directory / f"{stem}.key", _PUBLIC_BANNER + _zpl(public))
        _write_private(directory / f"{stem}.key_secret", _SECRET_BANNER + _zpl(public, secret))


def ensure_keys(directory: Path) -> bool:
    """Make the key pairs in ``directory`` unless its server key is there; whether made.

    Run by the scheduler's side before it binds: the run directory then holds the keys
    its own tools (``asyncrl-scheduler status``, workers started by hand) dial with.
    """
    if (Path(directory) / SERVER_SECRET).exists():
        return False
    try:
        keygen(directory)
    except FileExistsError:  # some are there: loading names what lacks
        return False
    return True


def payload_keys(seed: bytes) -> ClientKeys:
    """The data plane's key pair from its 32-byte ``seed`` (identity.payload_secret): each
    payload server serves it and admits only it, and each fetcher presents it."""
    if len(seed) != 32:
        raise ValueError(f"a payload key is 32 bytes, not {len(seed)}")
    secret = z85.encode(seed)  # any 32 bytes are a Curve25519 secret key
    public = zmq.curve_public(secret)
    return ClientKeys(public=public, secret=secret, server_public=public)


def load_server_keys(directory: Path) -> ServerKeys:
    """The scheduler's keys from ``directory``: its own pair, and the client key to allow."""
    public, secret = _load_pair(Path(directory), SERVER_SECRET)
    client = _load_public(Path(directory), CLIENT_PUBLIC)
    return ServerKeys(public=public, secret=secret, clients=frozenset({client}))


def load_client_keys(directory: Path) -> ClientKeys:
    """A worker's keys from ``directory``: the client pair and the scheduler's public key."""
    public, secret = _load_pair(Path(directory), CLIENT_SECRET)
    server = _load_public(Path(directory), SERVER_PUBLIC)
    return ClientKeys(public=public, secret=secret, server_public=server)


def curve_required(endpoint: str, mode: CurveMode) -> bool:
    """Whether the bus at ``endpoint`` is encrypted: ``auto`` is on for every TCP endpoint.

    A loopback port is open to every user of the machine, so loopback gets CURVE too; an
    ``ipc://`` socket is closed to them by its directory's modes, and ``inproc://`` never
    leaves the process.
    """
    if mode == "on":
        return True
    if mode == "off":
        return False
    if mode != "auto":
        raise ValueError(f"curve: got {mode!r}; allowed: 'auto', 'on', 'off'")
    return endpoint.startswith("tcp://")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, ``[v6]``, or ``localhost``) never leaves this machine."""
    name = host.strip().removeprefix("[").removesuffix("]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# --- files ------------------------------------------------------------------------------


def _zpl(public: bytes, secret: bytes | None = None) -> str:
    lines = ["metadata", "curve", f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    # O_EXCL: a file that appeared since the check (or a planted symlink) is an error, and
    # the mode is fixed at creation, so no moment exists where the file is readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(text)


def _read_keys(path: Path) -> dict[str, bytes]:
    hint = f"create keys with `asyncrl-scheduler keygen {path.parent}`"
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file; {hint}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise KeyFileError(f"{path}: cannot read the key file ({error}); {hint}") from None
    keys: dict[str, bytes] = {}
    for line in text.splitlines():
        match = _KEY_LINE.match(line)
        if match:
            keys[match[1]] = match[2].encode("ascii")
    for kind, key in keys.items():
        if not _is_z85_key(key):
            raise KeyFileError(f"{path}: the {kind} key is not a 40-character z85 key; {hint}")
    return keys


def _is_z85_key(key: bytes) -> bool:
    try:
        return len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError):
        return False


def _load_public(directory: Path, name: str) -> bytes:
    keys = _read_keys(directory / name)
    if "public" not in keys:
        raise KeyFileError(
            f"{directory / name}: no public-key line; "
            f"create keys with `asyncrl-scheduler keygen {directory}`"
        )
    return keys["public"]


def _load_pair(directory: Path, name: str) -> tuple[bytes, bytes]:
    path = directory / name
    keys = _read_keys(path)
    hint = f"create keys with `asyncrl-scheduler keygen {directory}`"
    if "public" not in keys or "secret" not in keys:
        raise KeyFileError(f"{path}: needs a public-key and a secret-key line; {hint}")
    if zmq.curve_public(keys["secret"]) != keys["public"]:
        raise KeyFileError(f"{path}: the public key does not belong to the secret key; {hint}")
    return keys["public"], keys["secret"]
