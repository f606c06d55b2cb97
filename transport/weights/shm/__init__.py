"""Weights through shared memory, for generators on the trainer's host.

The strategy (``strategy.py``, which brings torch) is imported at first use
(``transport/_lazy.py``); the slot files' own helpers are not torch's.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports
from .slot_file import ram_directory, sweep

if TYPE_CHECKING:
    from .strategy import ShmPublisher, ShmReceiver

__all__ = ["ShmPublisher", "ShmReceiver", "ram_directory", "sweep"]

__getattr__ = lazy_exports(globals(), dict.fromkeys(["ShmPublisher", "ShmReceiver"], ".strategy"))
