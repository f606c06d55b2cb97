"""A package's exported names, each imported from its module at first use (PEP 562).

For packages whose modules bring torch (about a second and a quarter of CPU to import):
a process that uses only their light modules (the launcher, which reads a weight slot's
owner and sweeps what a run left in /dev/shm) then starts without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: ``exports`` maps each name to the module (relative
    to the package whose ``globals()`` is ``namespace``) that defines it."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # found directly from now on
        return value

    return __getattr__
