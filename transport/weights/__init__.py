"""The weight plane: how the trainer's new weights reach the generators (never the bus).

Strategies sit behind :class:`WeightPublisher` and :class:`WeightReceiver`, the contract
in ``base.py``; ``factory.py`` builds the one ``weights.strategy`` names:

- ``ucx`` (the default): the trainer stages each version in one of two CPU buffers and
  serves it in checksummed buckets over UCX; generators pull it, relay it on to other
  generators, and run on it once whole and checked (:mod:`.ucx`);
- ``shm``: generators on the trainer's host map the buffer it staged into /dev/shm, so
  no generator copies it (:mod:`.shm`);
- ``files``: each version is a safetensors file in the run directory, written whole and
  renamed into place; for tests, or hosts that share a filesystem but no fabric.

The names below are imported at first use (``transport/_lazy.py``): importing a light
module of the package, as the launcher does, brings no torch.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .base import (
        Announcement,
        NeedsPlan,
        Received,
        WeightPublisher,
        WeightReceiver,
        WeightsPlan,
    )
    from .dirs import WeightDirs
    from .factory import make_publisher, make_receiver
    from .mac import WeightsAccess, weights_key

__all__ = [
    "Announcement",
    "NeedsPlan",
    "Received",
    "WeightDirs",
    "WeightPublisher",
    "WeightReceiver",
    "WeightsAccess",
    "WeightsPlan",
    "make_publisher",
    "make_receiver",
    "weights_key",
]

__getattr__ = lazy_exports(
    globals(),
    {
        **dict.fromkeys(
            ["Announcement", "NeedsPlan", "Received", "WeightPublisher", "WeightReceiver",
             "WeightsPlan"],
            ".base",
        ),
        "WeightDirs": ".dirs",
        **dict.fromkeys(["make_publisher", "make_receiver"], ".factory"),
        **dict.fromkeys(["WeightsAccess", "weights_key"], ".mac"),
    },
)  # fmt: skip
