"""How the members of a group of ranks find each other: three environment variables.

A *gang* is a set of worker processes that live and die together (a training group of
N ranks). Each member is told its rank and the group's size when it is specified, and the
leader's address (``HOST:PORT``, a port fresh for every start of the group) when it is
started; the leader (rank 0) listens there and the others dial it.
"""

from __future__ import annotations

import socket

__all__ = ["ENV_ADDR", "ENV_RANK", "ENV_SIZE", "free_local_address"]

ENV_RANK = "ASYNCRL_GANG_RANK"
ENV_SIZE = "ASYNCRL_GANG_SIZE"
ENV_ADDR = "ASYNCRL_GANG_ADDR"


def free_local_address(host: str = "127.0.0.1") -> str:
    """``HOST:PORT`` with a port nobody listens on now (the leader binds it moments later)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"
