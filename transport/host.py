"""This host: who shares its RAM-backed memory (the weight plane and the data plane map
each other's files only when this identity matches), taking room in it, a directory of
one's own in it (:func:`private_directory`), whether a
process on it is alive (a file a dead process left is stale), and the address other
machines reach it by."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import stat
from functools import cache
from pathlib import Path

__all__ = [
    "WILDCARD_HOSTS",
    "NoPages",
    "host_identity",
    "machine_address",
    "private_directory",
    "process_alive",
    "reserve_pages",
    "route_source",
]


# What a socket bound to every interface reports as its host: nobody can dial it.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*"})
# Documentation addresses (RFC 5737, RFC 3849): a UDP socket "connected" to one picks the
# route a packet would leave by, and sends nothing.
_ROUTE_PROBES = ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1"))


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


def private_directory(directory: Path, holds: str) -> None:
    """Make ``directory`` (and any parent missing) for this user alone, 0700; or, where it
    is already, check it is: PermissionError if it is a link, another user's, or open to
    others (who could have put files in it, or read what it ``holds``).

    /dev/shm is shared by every user of the host, and the names in it are predictable:
    another user may have made ours first."""
    missing = []
    path = directory
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            path.mkdir(mode=0o700)
    info = os.lstat(directory)
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or mode & 0o077:
        kind = "directory" if stat.S_ISDIR(info.st_mode) else "link or file"
        raise PermissionError(
            f"{directory} {holds} but is not this user's alone ({kind}, owner "
            f"{info.st_uid}, mode {mode:o}); remove it"
        )


@cache
def host_identity() -> str:
    """Who shares this process's RAM-backed memory and its process ids: the host name,
    this boot of its kernel (a reboot empties /dev/shm), then the kernel's view of it.

    Containers on one machine share its kernel, and so its boot id, yet each has its own
    ``/dev/shm`` and, mostly, its own PID and network namespaces: files there and pids
    mean nothing to a process in another, and UCX's shared memory did not carry a byte
    between two that shared ``/dev/shm`` and IPC but had PIDs and a network of their
    own. So two processes are on one host only if they see the same ``/dev/shm`` (its
    device and inode) and the same PID and network namespaces, whatever their boot ids
    and names say."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}/{_kernel_view()}"


def _kernel_view() -> str:
    try:
        shm = os.stat("/dev/shm")
        memory = f"shm{shm.st_dev}.{shm.st_ino}"
    except OSError:
        memory = "shm-"
    spaces = []
    for kind in ("pid", "net"):
        try:  # "pid:[4026531836]": the namespace's inode, the kernel's name for it
            spaces.append(f"{kind}{os.stat(f'/proc/self/ns/{kind}').st_ino}")
        except OSError:
            spaces.append(f"{kind}-")
    return "-".join([memory, *spaces])


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts: it is alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def machine_address(ipv6_first: bool = False) -> str:
    """The address other machines reach this one by: the one its default route leaves
    from (IPv4 first, unless ``ipv6_first``), else its fully qualified host name."""
    probes = reversed(_ROUTE_PROBES) if ipv6_first else _ROUTE_PROBES
    for family, probe in probes:
        try:
            address = route_source(probe, family=family)
        except OSError:  # no route of this family
            continue
        if not ipaddress.ip_address(address).is_loopback:
            return address
    return socket.getfqdn()


def route_source(host: str, port: int = 9, *, family: int | None = None) -> str:
    """This machine's address that packets to ``host`` leave from. A UDP socket
    "connected" there picks the route and sends nothing; OSError when there is none."""
    if family is None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        udp.connect((host, port))
        return udp.getsockname()[0]
