"""The weight-plane contract that every strategy implements (``factory.py`` picks one).

A trainer holds a :class:`WeightPublisher`: ``publish`` makes a version fetchable and
returns the :class:`Announcement` the scheduler passes on. A generator holds a
:class:`WeightReceiver`: it is handed the scheduler's :class:`WeightsPlan` (the version's
manifest and whom to pull it from) as it came over the bus, fetches in the background,
and answers ``poll`` with a :class:`Received` version to run on, or :class:`NeedsPlan`
when its source failed and the scheduler must name another.

This module imports no strategy: strategies import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..messages import WeightsPlan

__all__ = [
    "MAPPED",
    "Announcement",
    "NeedsPlan",
    "Received",
    "WeightPublisher",
    "WeightReceiver",
    "WeightsPlan",
]


@dataclass(frozen=True)
class Announcement:
    """What a trainer hands the scheduler with version ``version``: how to fetch it.

    ``manifest`` is the strategy's description of the bytes (layout, bucket checksums), a
    MessagePack-able dict the scheduler passes on untouched; ``address`` is where the
    publisher serves them (b"" for a strategy that needs no peer, such as files).
    """

    version: int
    manifest: dict[str, object]
    address: bytes = b""


MAPPED = "mapped"
"""The source of a version mapped from its publisher's files on this host: the bytes came
from no worker, whichever one the plan named (a relay, for a receiver that asked before it
knew it would map)."""


@dataclass(frozen=True)
class Received:
    """A whole, checked version, ready for a model to run on."""

    version: int
    state: dict[str, torch.Tensor]  # may be views of the receiver's buffer: see loaded()
    nbytes: int
    transfer_s: float  # from the first plan to the last checked byte
    source: str  # the worker the bytes came from, or MAPPED
    attempts: int = 1  # sources tried: more than 1 when one failed mid-way
    retried_buckets: int = 0  # buckets fetched again after failing their checksum
    slot: int = -1  # the receiver's buffer holding it, if it has buffers


@dataclass(frozen=True)
class NeedsPlan:
    """The fetch of ``version`` lost its source (``failed``); ask for another."""

    version: int
    failed: str
    reason: str


@runtime_checkable
class WeightPublisher(Protocol):
    def prepare(self, state: Mapping[str, torch.Tensor]) -> None:
        """Start making the buffers versions of ``state``'s layout go into, in the
        background; the first ``publish`` waits for them. Without it that publish makes
        them, holding the trainer: seconds for a model of gigabytes."""
        ...

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> Announcement:
        """Make ``version``'s ``state`` fetchable; what to tell the scheduler."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class WeightReceiver(Protocol):
    address: bytes  # where this receiver relays from (b"" if it does not)

    @property
    def target(self) -> int | None:
        """The version being fetched, if any."""
        ...

    def want(self, plan: WeightsPlan) -> None:
        """Fetch ``plan``'s version (in the background); older plans are ignored."""
        ...

    def poll(self) -> Received | NeedsPlan | None:
        """What the fetch came to, reported once."""
        ...

    def loaded(self, received: Received) -> None:
        """The model now runs on ``received.state``: its memory must stay as it is."""
        ...

    def close(self) -> None: ...
