"""Dialling a test's scheduler as its own tools do: with the keys its run directory holds.

The bus is under CURVE on every TCP endpoint (loopback included), and a worker registers
only with the worker key of its name and role: a test that plays a worker or an observer
reads both from the run directory, as ``asyncrl-worker`` and ``asyncrl-scheduler status``
do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import zmq

from asyncrl.transport.identity import connection_identity, load_run_secret, worker_key
from asyncrl.transport.security import ClientKeys, load_client_keys
from asyncrl.transport.zmq_link import ZmqLink

__all__ = ["bus_keys", "curve_client", "run_link", "worker_routing_id"]


def _endpoints(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "endpoints.json").read_text())


def bus_keys(run_dir: Path, keys_dir: Path | None = None) -> ClientKeys | None:
    """The client keys to dial the scheduler of ``run_dir`` with; None on a plain bus."""
    if not _endpoints(run_dir)["curve"]:
        return None
    return load_client_keys(keys_dir or run_dir / "keys")


def worker_routing_id(run_dir: Path, name: str, role: str | None) -> str:
    """``name``'s routing id as one of the run's ``role`` workers; a random tag (an
    observer's, which registers nothing) for no role."""
    key = None if role is None else worker_key(load_run_secret(run_dir / "run.secret"), name, role)
    return connection_identity(name, key)


def run_link(
    run_dir: Path,
    name: str,
    role: str | None = None,
    *,
    keys_dir: Path | None = None,
    **options: Any,
) -> ZmqLink:
    """A link to the scheduler of ``run_dir``, as worker ``name`` of ``role`` (None: an
    observer), with the run's bus keys (or those in ``keys_dir``)."""
    where = _endpoints(run_dir)
    return ZmqLink(
        where["control"],
        where["events"],
        identity=worker_routing_id(run_dir, name, role),
        client_keys=bus_keys(run_dir, keys_dir),
        **options,
    )


def curve_client(socket: zmq.Socket, run_dir: Path) -> None:
    """Set a raw socket's CURVE client options from ``run_dir`` (before it connects)."""
    keys = bus_keys(run_dir)
    if keys is not None:
        socket.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
