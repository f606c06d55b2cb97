"""Weights through shared memory, for generators on the trainer's host."""

from .slot_file import default_directory, sweep
from .strategy import ShmPublisher, ShmReceiver

__all__ = ["ShmPublisher", "ShmReceiver", "default_directory", "sweep"]
