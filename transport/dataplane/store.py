"""A worker's payloads, kept until the scheduler no longer refers to them.

A payload enters with :meth:`PayloadStore.put`: laid out once as an image (see image.py)
and checksummed. Where the host has a RAM-backed ``/dev/shm``, the image is a file in the
store's own directory there, so that readers on this host map it instead of fetching it
(:func:`shared_path` says where); the server sends the same mapping to readers elsewhere.

A key is *pending* until the scheduler answers the completion that refers to it: only
answered keys are reported in Held, so the scheduler never frees a key before it has
journaled its reference.

A payload's pages are allocated before it is written (:func:`host.reserve_pages`): writing a
page a full tmpfs cannot give kills the writer with SIGBUS, so a full ``/dev/shm`` is a
:class:`StoreFull` naming the size and the directory instead, which fails the lease that
made the payload (its groups go back, nothing is lost).

A store's directory holds an ``owner`` file with its process id; a new store removes the
directories of stores whose process is gone (a worker killed with -9 cannot clean up).

The stores' directories are inside one directory per user, ``/dev/shm/asyncrl-payloads-of-UID``,
0700 and checked to be this user's before it is used: ``/dev/shm`` itself is listable by
everyone, and a store's name is part of every reference to its payloads.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import crc32c
import structlog

from .. import protocol as p
from ..host import NoPages, host_identity, process_alive, reserve_pages
from ..messages.data import check_store_name
from . import image

__all__ = [
    "PayloadStore",
    "StoreFull",
    "StoreStats",
    "default_shared_dir",
    "shared_path",
    "store_owners",
    "sweep_stale",
    "user_shared_dir",
]

log = structlog.get_logger("asyncrl.dataplane")

_PREFIX = "asyncrl-payloads-"
_OWNER = "owner"


def default_shared_dir(shm: Path = Path("/dev/shm")) -> Path | None:
    """This user's private directory in RAM-backed shared memory ``shm``, where this host
    has it; None where it has none, or the directory is not this user's."""
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return None
    return _private_dir(user_shared_dir(shm))


def _private_dir(path: Path) -> Path | None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        # Made by someone else (to read what we would put there): never used.
        log.warning("payloads kept in process memory: the shared memory directory is not "
                    "this user's", directory=str(path), owner=info.st_uid)  # fmt: skip
        return None
    if stat.S_IMODE(info.st_mode) != 0o700:
        # Ours, opened by hand: /dev/shm is sticky, so nobody else can swap it meanwhile.
        os.chmod(path, 0o700)
    return path


def shared_path(shared_dir: Path, store: str, key: int) -> Path:
    """Where store ``store`` keeps payload ``key`` in ``shared_dir``; ValueError if
    ``store`` is no store's name (a reference that would lead out of ``shared_dir``)."""
    check_store_name(store)
    return shared_dir / f"{_PREFIX}{store}" / str(int(key))


def sweep_stale(shared_dir: Path, *, mine_too: bool = False) -> int:
    """Remove the store directories of processes that are gone, and with ``mine_too``
    this process's own (it holds no store any more); how many were removed. A store of
    another host that shares this directory (a container's) is left to its own host."""
    removed = 0
    for directory, pid in store_owners(shared_dir).items():
        mine = pid == os.getpid()
        if (mine and mine_too) or (not mine and not process_alive(pid)):
            shutil.rmtree(directory, ignore_errors=True)
            removed += 1
    return removed


def user_shared_dir(shm: Path = Path("/dev/shm")) -> Path:
    """Where :func:`default_shared_dir` keeps this user's stores in ``shm`` (not made)."""
    return shm / f"asyncrl-payloads-of-{os.geteuid()}"


def store_owners(shared_dir: Path) -> dict[Path, int]:
    """This user's store directories in ``shared_dir`` that belong to this host, and the
    process each belongs to. A store of another host that shares the directory (a
    container's) is left out: its pid is not one of ours."""
    owners = {}
    for directory in shared_dir.glob(f"{_PREFIX}*"):
        try:
            if directory.lstat().st_uid != os.getuid():
                continue
            pid_text, _, host = (directory / _OWNER).read_text().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue  # being made right now, not a store, or not ours
        if not host or host == host_identity():  # no host: written before hosts were named
            owners[directory] = pid
    return owners


class StoreFull(Exception):
    """The shared-memory directory has no room for a payload; the message says how much
    it needed, where, and what was free."""


@dataclass(frozen=True, slots=True)
class StoreStats:
    payloads: int
    bytes: int
    peak_bytes: int


class PayloadStore:
    """Payloads by key, shared by the worker's main thread and its server's thread."""

    def __init__(self, holder: str, address: str = "", shared_dir: Path | None = None) -> None:
        self.holder = holder
        self.address = address  # where the server answers; set once it is bound
        self.store_id = secrets.token_hex(8)  # a restarted process never reuses it
        self._lock = threading.Lock()
        self._images: dict[int, mmap.mmap | bytearray] = {}
        self._acknowledged: set[int] = set()
        self._next_key = 1
        self._bytes = 0
        self._peak = 0
        self.directory: Path | None = None
        if shared_dir is not None:
            sweep_stale(shared_dir)
            self.directory = shared_dir / f"{_PREFIX}{self.store_id}"
            self.directory.mkdir(mode=0o700)
            (self.directory / _OWNER).write_text(f"{os.getpid()} {host_identity()}")

    def put(self, payload: p.Payload) -> p.PayloadRef:
        """Keep ``payload``; the reference a reader fetches it by."""
        return self.put_frames(p.payload_frames(payload))

    def put_frames(self, frames: list[bytes | memoryview]) -> p.PayloadRef:
        """Keep the payload ``frames`` encode (:func:`protocol.payload_frames`)."""
        size = image.size_of(frames)
        with self._lock:
            key = self._next_key
            self._next_key += 1
        kept = self._allocate(key, size)
        image.write(frames, memoryview(kept))
        checksum = crc32c.crc32c(kept)
        with self._lock:
            self._images[key] = kept
            self._bytes += size
            self._peak = max(self._peak, self._bytes)
        host = host_identity() if self.directory is not None else ""
        return p.PayloadRef(self.holder, self.address, self.store_id, key, size, checksum, host)

    def _allocate(self, key: int, size: int) -> mmap.mmap | bytearray:
        if self.directory is None:
            return bytearray(size)
        path = self.directory / str(key)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            reserve_pages(fd, size, self.directory)  # fresh pages read as zeros: padding done
            return mmap.mmap(fd, size)
        except NoPages as full:
            os.unlink(path)
            raise StoreFull(
                f"shared memory: a payload of {size:,} bytes does not fit in {self.directory} "
                f"({full.free_bytes:,} bytes free); give /dev/shm more room (a container's "
                f"--shm-size) or free it"
            ) from None
        finally:
            os.close(fd)

    def get(self, key: int) -> memoryview | None:
        """The image of ``key`` for the server (a view: sending it copies nothing)."""
        with self._lock:
            kept = self._images.get(key)
            return None if kept is None else memoryview(kept)

    def acknowledge(self, keys: Iterable[int]) -> None:
        """The scheduler journaled references to ``keys``: they may be reported as held."""
        with self._lock:
            self._acknowledged.update(k for k in keys if k in self._images)

    def acknowledged(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._acknowledged))

    def keys(self) -> set[int]:
        with self._lock:
            return set(self._images)

    def discard(self, keys: Iterable[int]) -> int:
        """Free ``keys`` (unknown ones are ignored). Returns how many bytes were freed.

        A mapping still being sent, or mapped by a reader, stays valid until it is let go:
        the file's name goes now, its pages when the last view does.
        """
        freed = 0
        with self._lock:
            for key in keys:
                kept = self._images.pop(key, None)
                self._acknowledged.discard(key)
                if kept is None:
                    continue
                freed += len(kept)
                if self.directory is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.directory / str(key))
            self._bytes -= freed
        return freed

    def close(self) -> None:
        """Free everything, the shared directory too."""
        self.discard(self.keys())
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(len(self._images), self._bytes, self._peak)
