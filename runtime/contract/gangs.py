"""How the members of a group of ranks find each other: three environment variables.

A *gang* is a set of worker processes that live and die together (a training group of
N ranks). Each member is told its rank and the group's size when it is specified, and the
leader's address (``HOST:PORT``, a port fresh for every start of the group) when it is
started; the leader (rank 0) listens there and the others dial it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENV_ADDR", "ENV_RANK", "ENV_SIZE", "GangPlace", "free_local_address"]

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
    host: str
    port: int

    @property
    def leads(self) -> bool:
        return self.rank == _LEADER

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GangPlace | None:
        """The place the environment gives, or None outside a group; bad values raise."""
        env = os.environ if env is None else env
        if ENV_SIZE not in env:
            return None
        try:
            size, rank = int(env[ENV_SIZE]), int(env.get(ENV_RANK, ""))
            host, _, port = env.get(ENV_ADDR, "").rpartition(":")
            place = cls(rank, size, host.strip("[]"), int(port))
        except ValueError:
            raise ValueError(
                f"{ENV_RANK}, {ENV_SIZE} and {ENV_ADDR} must be integers and HOST:PORT; got "
                f"{env.get(ENV_RANK)!r}, {env.get(ENV_SIZE)!r}, {env.get(ENV_ADDR)!r}"
            ) from None
        if not (0 <= place.rank < place.size and place.host and 0 < place.port < 65536):
            raise ValueError(f"{ENV_RANK}={rank} {ENV_SIZE}={size} {ENV_ADDR}={host}:{port}")
        return place
