"""The weight-plane contract, and the choice of strategy from the config.

A trainer holds a :class:`WeightPublisher`: ``publish`` makes a version fetchable and
returns the :class:`Announcement` the scheduler passes on. A generator holds a
:class:`WeightReceiver`: it is handed a :class:`Plan` (the version's manifest and whom to
pull it from), fetches in the background, and answers ``poll`` with a :class:`Received`
version to run on, or :class:`NeedsPlan` when its source failed and the scheduler must
name another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from asyncrl.runtime.config import WeightsSection

__all__ = [
    "Announcement",
    "NeedsPlan",
    "Plan",
    "Received",
    "WeightPublisher",
    "WeightReceiver",
    "make_publisher",
    "make_receiver",
    "shm_directory",
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


@dataclass(frozen=True)
class Plan:
    """What the scheduler tells a receiver: ``version``'s manifest and whom to pull it from.

    ``source`` is the worker serving it (the publisher, or a receiver relaying it) and
    ``source_address`` its weight-plane address.
    """

    version: int
    manifest: dict[str, object]
    source: str
    source_address: bytes = b""


@dataclass(frozen=True)
class Received:
    """A whole, checked version, ready for a model to run on."""

    version: int
    state: dict[str, torch.Tensor]  # may be views of the receiver's buffer: see loaded()
    nbytes: int
    transfer_s: float  # from the first plan to the last checked byte
    source: str
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

    def want(self, plan: Plan) -> None:
        """Fetch ``plan``'s version (in the background); older plans are ignored."""
        ...

    def poll(self) -> Received | NeedsPlan | None:
        """What the fetch came to, reported once."""
        ...

    def loaded(self, received: Received) -> None:
        """The model now runs on ``received.state``: its memory must stay as it is."""
        ...

    def close(self) -> None: ...


def make_publisher(weights: WeightsSection, run_dir: Path) -> WeightPublisher:
    """The trainer's side of the strategy named by ``weights.strategy``."""
    if weights.strategy == "ucx":
        from .ucx import UcxPublisher

        return UcxPublisher(
            bucket_mb=weights.produce_bucket_mb,
            progress_mode=weights.progress_mode,
            send_timeout_s=weights.stall_timeout_s,
            share_dir=shm_directory(weights, run_dir) if weights.map_on_host else None,
        )
    if weights.strategy == "shm":
        from .shm import ShmPublisher

        return ShmPublisher(shm_directory(weights, run_dir), bucket_mb=weights.produce_bucket_mb)
    if weights.strategy == "files":
        from .files import FilePublisher

        return FilePublisher(run_dir / "weights")
    raise ValueError(f"weights.strategy={weights.strategy!r}: {_STRATEGIES}")


def make_receiver(weights: WeightsSection, run_dir: Path, *, relay: bool = True) -> WeightReceiver:
    """A generator's side of the strategy named by ``weights.strategy``."""
    if weights.strategy == "ucx":
        from .ucx import UcxReceiver

        ucx = UcxReceiver(
            bucket_mb=weights.consume_bucket_mb,
            progress_mode=weights.progress_mode,
            stall_timeout_s=weights.stall_timeout_s,
            relay=relay,
        )
        if not weights.map_on_host:
            return ucx
        from .host_aware import HostAwareReceiver
        from .shm import ShmReceiver

        return HostAwareReceiver(ucx, ShmReceiver())
    if weights.strategy == "shm":
        from .shm import ShmReceiver

        return ShmReceiver()
    if weights.strategy == "files":
        from .files import FileReceiver

        return FileReceiver(run_dir / "weights")
    raise ValueError(f"weights.strategy={weights.strategy!r}: {_STRATEGIES}")


def shm_directory(weights: WeightsSection, run_dir: Path) -> Path:
    """Where shared-memory slot files of a run go (``weights.shm_dir``, or /dev/shm)."""
    if weights.shm_dir:
        return Path(weights.shm_dir)
    from .shm import default_directory

    return default_directory(run_dir)


_STRATEGIES = "expected 'ucx', 'shm' or 'files'"
