"""Directories that appear whole or not at all (checkpoints, ``final/``), and what a
killed writer leaves of them.

A directory is written under a temporary name beside its target (:func:`temporary_beside`),
fsynced, and put in place by one rename: ``renameat2(RENAME_EXCHANGE)`` swaps it with the
directory it replaces, so the target is at every moment the old one or the new one, never
missing; the directory holding both is fsynced after, so the swap survives a power cut. The
old one, now under the temporary name, is then removed. A directory is removed the same
way round: renamed away, then deleted, so a crash never leaves half of it under its name.

A temporary name says which host and process made it (``.NAME.tmp-HOST-PID-XXXX``): one
whose process is gone from this host is a leftover of a kill, which the next writer in the
same directory (:func:`remove_leftovers`) or ``asyncrl clean`` removes. Where the file
system cannot exchange (EINVAL: NFS, some FUSE), the old directory is renamed away first
and the new one in after; a crash between leaves the old one under its temporary name,
which :func:`restore_parked` puts back on the next write.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from asyncrl.transport.host import host_identity, process_alive

__all__ = [
    "Leftover",
    "fsync_directory",
    "leftovers",
    "remove_directory",
    "remove_leftovers",
    "replace_directory",
    "restore_parked",
    "temporary_beside",
]

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[^/]+$")
_PARKED = "parked"  # the random part of an old directory's name while the new one goes in


@dataclass(frozen=True, slots=True)
class Leftover:
    path: Path
    pid: int


def temporary_beside(target: Path) -> Path:
    """A new private directory beside ``target``, named for this host and process."""
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-{_host_tag()}-{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))


def replace_directory(new: Path, target: Path) -> None:
    """Put the directory ``new`` (made by :func:`temporary_beside`, its files synced) in
    place of ``target``, whether or not there is one; durable on return."""
    fsync_directory(new)  # its entries: the files written into it
    old: Path | None = None
    if not target.exists():
        os.rename(new, target)
    elif _exchange(new, target):
        old = new  # which now names the old directory
    else:
        old = target.parent / f".{target.name}.tmp-{_host_tag()}-{os.getpid()}-{_PARKED}"
        os.rename(target, old)
        os.rename(new, target)
    fsync_directory(target.parent)
    if old is not None:
        shutil.rmtree(old)


def remove_directory(path: Path) -> None:
    """Remove the directory ``path``: gone from its name at once, then deleted."""
    away = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{_host_tag()}-{os.getpid()}-",
                                 dir=path.parent))  # fmt: skip
    os.rename(path, away / path.name)
    fsync_directory(path.parent)
    shutil.rmtree(away)


def restore_parked(target: Path) -> None:
    """If a crash left ``target`` renamed away and nothing in its place (a file system
    without exchange), put it back."""
    if target.exists():
        return
    for parked in target.parent.glob(f".{target.name}.tmp-*-{_PARKED}"):
        os.rename(parked, target)
        fsync_directory(target.parent)
        return


def leftovers(directory: Path) -> list[Leftover]:
    """The temporary directories in ``directory`` whose process is gone from this host
    and that this user owns."""
    found = []
    for path in directory.glob(".*.tmp-*"):
        match = _TEMPORARY.match(path.name)
        if match is None or match["host"] != _host_tag():
            continue  # not a temporary name, or another host's: its processes are not here
        if _is_parked(path) and not (directory / match["name"]).exists():
            continue  # the only copy of its target until restore_parked puts it back
        pid = int(match["pid"])
        if pid != os.getpid() and not process_alive(pid) and _mine(path):
            found.append(Leftover(path, pid))
    return found


def remove_leftovers(directory: Path) -> int:
    """Remove :func:`leftovers` of ``directory``; how many."""
    gone = leftovers(directory)
    for leftover in gone:
        shutil.rmtree(leftover.path, ignore_errors=True)
    return len(gone)


def fsync_directory(directory: Path) -> None:
    """Make ``directory``'s entries (names made, renamed or removed) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one step; False where the file system cannot."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(a), None, str(b))


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _host_tag() -> str:
    return hashlib.sha256(host_identity().encode()).hexdigest()[:8]


def _is_parked(path: Path) -> bool:
    # A parked directory is the only copy of its target until it is put back.
    return path.name.endswith(f"-{_PARKED}")


def _mine(path: Path) -> bool:
    try:
        return path.lstat().st_uid == os.getuid()
    except FileNotFoundError:
        return False
