"""The one error a task, a reward or an environment plug-in fails its group with."""

from __future__ import annotations

__all__ = ["TaskError"]


class TaskError(ValueError):
    """A task plug-in that cannot be loaded, or that broke its contract."""
