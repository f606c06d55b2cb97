"""The choice of weight-plane strategy from the config: ``weights.strategy`` names one.

Strategies are imported only when chosen, so a process pays for UCX only if it uses it.
Where a strategy keeps files is the caller's to say (:class:`WeightDirs`): the run
directory's layout is not the weight plane's business; nor is whether the run is local and
what its key is (:class:`WeightsAccess`, for ucx).
"""

from __future__ import annotations

from typing import Literal, Protocol

from .base import WeightPublisher, WeightReceiver
from .dirs import WeightDirs
from .mac import LOCAL_ONLY, WeightsAccess

__all__ = ["WeightsChoice", "make_publisher", "make_receiver"]

_STRATEGIES = "expected 'ucx', 'shm' or 'files'"


class WeightsChoice(Protocol):
    """What the factories read of the config's ``weights`` section (the runtime's
    ``WeightsSection`` is one): the transport names no type of the layers above it."""

    @property
    def strategy(self) -> Literal["ucx", "shm", "files"]: ...
    @property
    def produce_bucket_mb(self) -> int: ...
    @property
    def consume_bucket_mb(self) -> int: ...
    @property
    def progress_mode(self) -> Literal["thread", "polling"]: ...
    @property
    def stall_timeout_s(self) -> float: ...
    @property
    def map_on_host(self) -> bool: ...


def make_publisher(
    weights: WeightsChoice, dirs: WeightDirs, access: WeightsAccess = LOCAL_ONLY
) -> WeightPublisher:
    """The trainer's side of the strategy named by ``weights.strategy``; ``access``: who
    may fetch its versions over UCX."""
    if weights.strategy == "ucx":
        from .ucx import UcxPublisher

        return UcxPublisher(
            bucket_mb=weights.produce_bucket_mb,
            progress_mode=weights.progress_mode,
            send_timeout_s=weights.stall_timeout_s,
            share_dir=dirs.shared if weights.map_on_host else None,
            access=access,
        )
    if weights.strategy == "shm":
        from .shm import ShmPublisher

        return ShmPublisher(dirs.shared, bucket_mb=weights.produce_bucket_mb)
    if weights.strategy == "files":
        from .files import FilePublisher

        return FilePublisher(dirs.files)
    raise ValueError(f"weights.strategy={weights.strategy!r}: {_STRATEGIES}")


def make_receiver(
    weights: WeightsChoice,
    dirs: WeightDirs,
    access: WeightsAccess = LOCAL_ONLY,
    *,
    parts: int = 1,
    relay: bool = True,
) -> WeightReceiver:
    """A generator's side of the strategy named by ``weights.strategy``; ``access``: who
    may reach its UCX node (a relay's versions, its requests' keys). ``parts``: how many
    parts each version comes in (more than 1 where every rank of a group publishes its
    own: parts.py), each part then taken by a receiver of the strategy of its own."""
    if parts < 2:
        return _strategy_receiver(weights, dirs, access, relay=relay)
    from .parts_receiver import PartsReceiver

    return PartsReceiver(
        [
            _strategy_receiver(weights, dirs.of_rank(rank), access, relay=relay)
            for rank in range(parts)
        ]
    )


def _strategy_receiver(
    weights: WeightsChoice, dirs: WeightDirs, access: WeightsAccess, *, relay: bool
) -> WeightReceiver:
    if weights.strategy == "ucx":
        from .ucx import UcxReceiver

        ucx = UcxReceiver(
            bucket_mb=weights.consume_bucket_mb,
            progress_mode=weights.progress_mode,
            stall_timeout_s=weights.stall_timeout_s,
            relay=relay,
            access=access,
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

        return FileReceiver(dirs.files)
    raise ValueError(f"weights.strategy={weights.strategy!r}: {_STRATEGIES}")
