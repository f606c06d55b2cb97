"""Starting a run's processes on one machine and keeping them going (`asyncrl run`)."""

from .events import EventKind, describe, print_event
from .supervisor import ChildSpec, OnEvent, Supervisor

__all__ = ["ChildSpec", "EventKind", "OnEvent", "Supervisor", "describe", "print_event"]
