"""The weight plane: how the trainer's new weights reach the generators (never the bus).

Strategies sit behind :class:`WeightSync` (``weights.strategy`` picks one):

- ``files``: each version is a safetensors file in the run directory, written whole and
  renamed into place; for one machine or a shared filesystem.
"""

from .base import Fetched, WeightSync, make_weight_sync

__all__ = ["Fetched", "WeightSync", "make_weight_sync"]
