"""Weights through shared memory, for generators on the trainer's host."""

from .slot_file import ram_directory, sweep
from .strategy import ShmPublisher, ShmReceiver

__all__ = ["ShmPublisher", "ShmReceiver", "ram_directory", "sweep"]
