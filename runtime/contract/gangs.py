"""How the members of a group of ranks find each other: three environment variables.

A *gang* is a set of worker processes that live and die together (a training group of
N ranks). Each member is told its rank and the group's size when it is specified, and the
leader's address (``HOST:PORT``, a port fresh for every start of the group) when it is
started; the leader (rank 0) listens there and the others dial it.

A group whose ranks several machines start (``asyncrl node --roles train@1``) has no one
process that could pick the address for all: its leader is told only its host
(``HOST:0``), listens on a port the system gives it, and announces ``HOST:PORT`` in the run
directory, which the run's machines share (:func:`announce_leader`); the other ranks are
told no address and read it there (:func:`announced_leader`). Nothing probes ports.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from asyncrl.runtime.contract.rundir import UntrustedFile, read_owned, write_private

__all__ = [
    "ENV_ADDR",
    "ENV_RANK",
    "ENV_SIZE",
    "GangPlace",
    "announce_leader",
    "announced_leader",
    "free_local_address",
]

ENV_RANK = "ASYNCRL_GANG_RANK"
ENV_SIZE = "ASYNCRL_GANG_SIZE"
ENV_ADDR = "ASYNCRL_GANG_ADDR"
_LEADER = 0


def free_local_address(host: str = "127.0.0.1") -> str:
    """``HOST:PORT`` with a port nobody listens on now (the leader binds it moments later)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"


@dataclass(frozen=True, slots=True)
class GangPlace:
    """This process's place in its group and where the group meets."""

    rank: int
    size: int
    host: str  # "" in a group that meets where its leader announces: see the module doc
    port: int  # 0: the leader listens where the system says and announces it

    @property
    def leads(self) -> bool:
        return self.rank == _LEADER

    @property
    def announced(self) -> bool:
        """Whether the group meets at the address its leader announces in the run
        directory (its ranks are on several machines), not at one given to every rank."""
        return self.port == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GangPlace | None:
        """The place the environment gives, or None outside a group; bad values raise."""
        env = os.environ if env is None else env
        if ENV_SIZE not in env:
            return None
        try:
            size, rank = int(env[ENV_SIZE]), int(env.get(ENV_RANK, ""))
            host, _, port = env.get(ENV_ADDR, ":0").rpartition(":")
            place = cls(rank, size, host.strip("[]"), int(port))
        except ValueError:
            raise ValueError(
                f"{ENV_RANK}, {ENV_SIZE} and {ENV_ADDR} must be integers and HOST:PORT; got "
                f"{env.get(ENV_RANK)!r}, {env.get(ENV_SIZE)!r}, {env.get(ENV_ADDR)!r}"
            ) from None
        # Only a group that meets where its leader announces goes without a host.
        addressed = bool(place.host) or place.announced
        if not (0 <= place.rank < place.size and addressed and 0 <= place.port < 65536):
            raise ValueError(f"{ENV_RANK}={rank} {ENV_SIZE}={size} {ENV_ADDR}={host}:{port}")
        return place


def announce_leader(path: Path, host: str, port: int) -> None:
    """Say in the run directory (``path``: RunDir.group_leader) where a group's leader
    listens now; each start of the leader says it again, for a new port."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_private(path, json.dumps({"host": host, "port": port, "pid": os.getpid()}))


def announced_leader(path: Path) -> tuple[str, int] | None:
    """Where the group's leader last said it listens; None before any leader said so.
    UntrustedFile for a file another user could have written, or one that does not read."""
    try:
        text = read_owned(path)  # UntrustedFile: another user's, or open to others
    except FileNotFoundError:
        return None
    try:
        said = json.loads(text)
        host, port = said["host"], said["port"]
    except (ValueError, KeyError, TypeError) as error:
        raise UntrustedFile(f"{path} does not read as a leader's address: {error}") from None
    if not (isinstance(host, str) and host and isinstance(port, int) and 0 < port < 65536):
        raise UntrustedFile(f"{path} does not hold a HOST and PORT: {said!r}")
    return host, port
