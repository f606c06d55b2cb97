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
"""

from .base import (
    Announcement,
    NeedsPlan,
    Received,
    WeightPublisher,
    WeightReceiver,
    WeightsPlan,
)
from .factory import WeightDirs, make_publisher, make_receiver
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
