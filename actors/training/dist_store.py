"""The group's store as ``torch.distributed`` sees it, and where a group on one machine
keeps its sockets.

``init_process_group`` takes any :class:`torch.distributed.Store`; this one passes every
call to the group's own store (transport/group_store.py), so gloo's and NCCL's rendezvous
go where the orders go: to the leader, authenticated, on the group's address only.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from asyncrl.runtime.contract.gangs import GangPlace
from asyncrl.transport.group_store import GroupStoreClient, GroupStoreServer, Limits
from asyncrl.transport.security import is_loopback

__all__ = ["RendezvousStore", "join_store", "loopback_interface", "on_loopback"]

_IFF_LOOPBACK = 0x8  # linux/if.h


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
    place: GangPlace, secret: bytes, timeout_s: float, limits: Limits | None = None
) -> tuple[GroupStoreServer | None, RendezvousStore]:
    """The leader's server (None on a follower) and this rank's store."""
    server = GroupStoreServer(place.host, place.port, secret, limits) if place.leads else None
    client = GroupStoreClient(place.host, place.port, secret, timeout_s=timeout_s)
    return server, RendezvousStore(client, timeout_s)


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
