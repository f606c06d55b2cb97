"""The group's store as ``torch.distributed`` sees it, how a rank finds it, and where a
group on one machine keeps its sockets.

``init_process_group`` takes any :class:`torch.distributed.Store`; this one passes every
call to the group's own store (transport/group_store.py), so gloo's and NCCL's rendezvous
go where the orders go: to the leader, authenticated, on the group's address only.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from asyncrl.runtime.contract.gangs import GangPlace, announce_leader, announced_leader
from asyncrl.runtime.contract.rundir import UntrustedFile
from asyncrl.transport.group_store import (
    GroupStoreClient,
    GroupStoreError,
    GroupStoreServer,
    Limits,
    StoreGone,
    StoreRefused,
)
from asyncrl.transport.security import is_loopback

__all__ = ["RendezvousStore", "join_store", "loopback_interface", "on_loopback"]

_IFF_LOOPBACK = 0x8  # linux/if.h
_ANSWER_S = 5.0  # a leader announced in the run directory answers within this, if it lives
_REREAD_S = 0.5  # how often a follower reads an announcement that led nowhere again


class RendezvousStore(dist.Store):
    """A :class:`torch.distributed.Store` over a :class:`GroupStoreClient`."""

    def __init__(self, client: GroupStoreClient, timeout_s: float):
        super().__init__()
        self.client = client
        self._timeout_s = timeout_s

    def set(self, key: str, value: bytes | str) -> None:
        self.client.call("set", key, _as_bytes(value))

    def get(self, key: str) -> bytes:
        return self.client.call("get", [key], self._timeout_s, waits_s=self._timeout_s)

    def add(self, key: str, amount: int) -> int:
        return self.client.call("add", key, amount)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self.client.call("compare_set", key, _as_bytes(expected), _as_bytes(desired))

    def delete_key(self, key: str) -> bool:
        return self.client.call("delete", key)

    def check(self, keys: list[str]) -> bool:
        return self.client.call("check", list(keys))

    def num_keys(self) -> int:
        return self.client.call("num_keys")

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout_s = timeout.total_seconds()

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = self._timeout_s if timeout is None else timeout.total_seconds()
        self.client.call("wait", list(keys), seconds, waits_s=seconds)


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def join_store(
    place: GangPlace,
    secret: bytes,
    timeout_s: float,
    limits: Limits | None = None,
    *,
    meeting: Path | None = None,
) -> tuple[GroupStoreServer | None, RendezvousStore]:
    """The leader's server (None on a follower) and this rank's store. A group that meets
    where its leader announces (``place.announced``) needs ``meeting``, the run
    directory's file for it: the leader writes its port there, the others read it."""
    if place.announced and (meeting is None or (place.leads and not place.host)):
        raise ValueError(
            "a group whose leader announces its address needs the file for it, "
            "and its leader the host it listens on"
        )
    if not place.leads:
        if place.announced:
            assert meeting is not None
            client = _find_leader(meeting, secret, timeout_s)
        else:
            client = GroupStoreClient(place.host, place.port, secret, timeout_s=timeout_s)
        return None, RendezvousStore(client, timeout_s)
    server = GroupStoreServer(place.host, place.port, secret, limits)
    if place.announced:
        assert meeting is not None
        announce_leader(meeting, place.host, server.port)
    client = GroupStoreClient(place.host, server.port, secret, timeout_s=timeout_s)
    return server, RendezvousStore(client, timeout_s)


def _find_leader(meeting: Path, secret: bytes, timeout_s: float) -> GroupStoreClient:
    """A client of the leader that answers at the address announced in ``meeting``,
    within ``timeout_s``. What is announced may be a start of the leader that is gone
    (a new one has not yet said where it listens): it is read again until one answers."""
    deadline = time.monotonic() + timeout_s
    tried: tuple[str, int] | None = None
    while True:
        try:
            where = announced_leader(meeting)
        except UntrustedFile as error:
            raise GroupStoreError(str(error)) from None
        if where is not None:
            tried = where
            probe = min(_ANSWER_S, max(deadline - time.monotonic(), 0.1))
            client = GroupStoreClient(*where, secret, timeout_s=probe)
            try:
                client.call("num_keys")
                client.timeout_s = timeout_s
                return client
            except StoreRefused:
                client.close()
                raise
            except GroupStoreError:
                client.close()  # not there (any more): read the announcement again
        if time.monotonic() >= deadline:
            said = "none announced" if tried is None else f"last announced {tried[0]}:{tried[1]}"
            raise StoreGone(
                f"no leader of the group answered within {timeout_s:g} s ({said} in {meeting})"
            )
        time.sleep(_REREAD_S)


def on_loopback(host: str) -> bool:
    """Whether a group meeting at ``host`` is on this one machine."""
    return is_loopback(host)


def loopback_interface(root: Path = Path("/sys/class/net")) -> str:
    """The name of this machine's loopback interface (``lo`` where it cannot be read)."""
    try:
        for device in sorted(root.iterdir()):
            if int((device / "flags").read_text(), 16) & _IFF_LOOPBACK:
                return device.name
    except (OSError, ValueError):
        pass
    return "lo"
