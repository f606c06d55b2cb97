"""This host: who shares its RAM-backed memory (the weight plane and the data plane map
each other's files only when this identity matches), taking room in it, and whether a
process on it is alive (a file a dead process left is stale)."""

from __future__ import annotations

import errno
import os
import socket
from functools import cache
from pathlib import Path

__all__ = ["NoPages", "host_identity", "process_alive", "reserve_pages"]


class NoPages(Exception):
    """A RAM-backed directory cannot give the pages asked for; ``free_bytes`` it has."""

    def __init__(self, free_bytes: int) -> None:
        super().__init__(f"{free_bytes} bytes free")
        self.free_bytes = free_bytes


def reserve_pages(fd: int, size: int, directory: Path) -> None:
    """Allocate the first ``size`` bytes of file ``fd``'s pages now (NoPages if full).

    Not just its size: writing a page a full tmpfs cannot give (a container's /dev/shm is
    often 64 MiB) kills the writer with SIGBUS, in the middle of whatever it was doing."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        space = os.statvfs(directory)
        raise NoPages(space.f_bavail * space.f_frsize) from None


@cache
def host_identity() -> str:
    """The host name and this boot of its kernel (a reboot empties /dev/shm)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts: it is alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
