"""Who shares this host's RAM-backed shared memory: the weight plane and the data plane
map each other's files only when this identity matches."""

from __future__ import annotations

import socket
from functools import cache
from pathlib import Path

__all__ = ["host_identity"]


@cache
def host_identity() -> str:
    """The host name and this boot of its kernel (a reboot empties /dev/shm)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"
