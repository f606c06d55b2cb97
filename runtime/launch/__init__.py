"""Starting a run's processes on one machine and keeping them going (`asyncrl run`)."""

from .supervisor import ChildSpec, OnEvent, Supervisor
from .supervisor_events import EventKind, describe, print_event

__all__ = ["ChildSpec", "EventKind", "OnEvent", "Supervisor", "describe", "print_event"]
