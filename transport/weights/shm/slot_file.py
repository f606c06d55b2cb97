"""One staged version in a shared-memory file, and the kernel locks that say who uses it.

A slot file is a 4 KiB header (magic, version, byte count, and which version's checksums
a generator has already checked) and the flat buffer after it.
Who may touch it is said with ``flock``, so the kernel keeps the rules even for a process
that dies without a word:

- the trainer holds an exclusive lock while it writes a version into the file, and takes
  it only when nobody holds a shared one (it never waits: it uses another file);
- a generator holds a shared lock from the moment it maps a version until its model runs
  on a newer one, so the bytes under its model never change.

The header's version is -1 while a version is being written, so a reader that got its
shared lock checks that the file still holds the version it was told about.

Every generator on the host maps the same pages, and nobody can write them while one
holds its shared lock; so the first generator to check a version's buckets against the
manifest records it in the header (the version and a digest of the checksums it checked
against), and the others, finding that record for the same manifest, need not read the
whole buffer again. The trainer clears the record whenever it writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import mmap
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import structlog

from ...host import NoPages, host_identity, private_directory, reserve_pages

__all__ = [
    "HEADER_BYTES",
    "Gone",
    "MapCache",
    "MappedVersion",
    "NoSpace",
    "SlotFile",
    "decode_address",
    "encode_address",
    "host_identity",
    "new_slot_paths",
    "ram_directory",
    "sweep",
    "trainer_of",
]

log = structlog.get_logger("asyncrl.weights")

HEADER_BYTES = 4096  # the buffer starts on a page, so every tensor view is aligned
_MAGIC = b"asyncrlW"
_HEADER = struct.Struct("<8sqq")  # magic, version (-1 while written), bytes
_CHECKED = struct.Struct("<qQ")  # version checked, digest of the checksums it matched
_CHECKED_AT = 64
_WRITING = -1
_NAME = re.compile(r"^[0-9]+-[0-9]+\.weights$")


class NoSpace(OSError):
    """The slot directory cannot hold another version; says how much was needed."""


class Gone(LookupError):
    """The file no longer holds the version asked for (rewritten, removed, or torn)."""


def encode_address(directory: Path) -> bytes:
    return msgpack.packb({"host": host_identity(), "dir": str(directory)})


def decode_address(address: bytes) -> tuple[str, Path]:
    """The publisher's host and slot directory; a ValueError naming what is wrong."""
    try:
        fields = msgpack.unpackb(address)
        host, directory = fields["host"], fields["dir"]
    except Exception as error:  # any malformed address is the same error to the caller
        raise ValueError(f"not a shared-memory weight address: {error!r:.120}") from None
    if not isinstance(host, str) or not isinstance(directory, str):
        raise ValueError("shared-memory weight address: host and dir must be strings")
    if not os.path.isabs(directory):
        raise ValueError(f"shared-memory weight address: {directory!r:.120} is not absolute")
    if "\0" in directory:
        raise ValueError(f"shared-memory weight address: {directory!r:.120} holds a NUL")
    return host, Path(directory)


def ram_directory(run_dir: Path) -> Path | None:
    """The run's own directory in RAM-backed /dev/shm, or None where there is none to use."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"asyncrl-{os.getuid()}-{digest}"
    return None


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"shared-memory weight file name {name!r:.60} is not a slot file's")
    return name


class SlotFile:
    """The trainer's side of one slot file: write versions into it when nobody reads it."""

    def __init__(self, path: Path, nbytes: int) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # a new file: nobody else can hold it yet
        self.version: int | None = None
        self.capacity = 0
        self._map: mmap.mmap | None = None
        try:
            self._grow(nbytes)
        except BaseException:
            self.remove()
            raise

    @property
    def name(self) -> str:
        return self.path.name

    def try_lock(self) -> bool:
        """Take the file for writing if no reader holds it (never waits)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def begin(self, nbytes: int) -> np.ndarray:
        """The buffer to write ``nbytes`` into; the header says a write is under way."""
        if nbytes > self.capacity:
            self._grow(nbytes)
        self._header(_WRITING, nbytes)
        self.version = None
        assert self._map is not None
        return np.frombuffer(self._map, np.uint8, count=nbytes, offset=HEADER_BYTES)

    def finish(self, version: int, nbytes: int) -> None:
        """The buffer holds ``version`` whole: say so, and let readers in."""
        self._header(version, nbytes)
        self.version = version
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def abandon(self) -> None:
        """The write failed: the file holds no version; let it be taken again."""
        self.version = None
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def remove(self) -> None:
        """Unlink and close: readers that mapped it keep their pages until they let go."""
        self.path.unlink(missing_ok=True)
        os.close(self.fd)

    def _header(self, version: int, nbytes: int) -> None:
        os.pwrite(self.fd, _HEADER.pack(_MAGIC, version, nbytes), 0)
        if version == _WRITING:
            os.pwrite(self.fd, _CHECKED.pack(_WRITING, 0), _CHECKED_AT)

    def _grow(self, nbytes: int) -> None:
        try:
            reserve_pages(self.fd, HEADER_BYTES + nbytes, self.path.parent)
        except NoPages as full:
            raise NoSpace(
                f"shared memory: a version needs {(HEADER_BYTES + nbytes) >> 20} MiB "
                f"in {self.path.parent}, which has {full.free_bytes >> 20} MiB "
                f"free; give it more room (a container's --shm-size), point weights.shm_dir "
                f"at a larger RAM-backed directory, or use weights.strategy=ucx with "
                f"weights.map_on_host=false"
            ) from None
        # The pages are allocated now, once per file, not during a timed staging copy.
        # The old map (if any) goes when the last view of it does.
        self._map = mmap.mmap(
            self.fd, HEADER_BYTES + nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE
        )
        self.capacity = nbytes


class MappedVersion:
    """A generator's read-only map of one version in a slot file, under a shared lock.

    The lock is held until :meth:`release`; the map itself lives as long as any view of
    it (the model's tensors), which is why it is never closed by hand.
    """

    def __init__(self, path: Path, version: int, nbytes: int, maps: MapCache) -> None:
        try:
            # Writable only for the header's check record; the buffer is mapped read-only.
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise Gone(f"{path.name} is gone (the trainer went away or moved on)") from None
        try:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise Gone(f"{path.name} is being rewritten with a newer version") from None
            magic, held, size = _HEADER.unpack(os.pread(self.fd, _HEADER.size, 0))
            if magic != _MAGIC:
                raise Gone(f"{path.name} is not a weight slot file")
            if held != version or size != nbytes:
                raise Gone(f"{path.name} holds version {held} ({size} bytes), not {version}")
            info = os.fstat(self.fd)
            if info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise Gone(f"{path.name} is not this user's alone: its weights are not loaded")
            if info.st_size < HEADER_BYTES + nbytes:
                raise Gone(f"{path.name} is shorter than its header says")
            self._map = maps.get(path, self.fd, HEADER_BYTES + nbytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.version = version
        self.buffer = np.frombuffer(self._map, np.uint8, count=nbytes, offset=HEADER_BYTES)

    @contextlib.contextmanager
    def checking(self) -> Iterator[None]:
        """Be the host's only generator checking this file until the block ends.

        A POSIX record lock on the check record (apart from the ``flock`` that pins the
        file): generators that map a version at the same time wait for the first one's
        check instead of each reading the whole buffer; the kernel drops the lock of one
        that dies.
        """
        fcntl.lockf(self.fd, fcntl.LOCK_EX, _CHECKED.size, _CHECKED_AT)
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, _CHECKED.size, _CHECKED_AT)

    def checked_by_a_peer(self, digest: int) -> bool:
        """Whether a generator already checked this version against the same checksums."""
        version, recorded = _CHECKED.unpack(os.pread(self.fd, _CHECKED.size, _CHECKED_AT))
        return version == self.version and recorded == digest

    def record_checked(self, digest: int) -> None:
        """Tell the host's other generators this version matched these checksums."""
        os.pwrite(self.fd, _CHECKED.pack(self.version, digest), _CHECKED_AT)

    def release(self) -> None:
        """Let the trainer write this file again.

        Unlocked by hand: a map keeps a duplicate of the descriptor it was made from, and
        a lock lasts while any duplicate is open.
        """
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


class MapCache:
    """A generator's read-only maps of slot files, kept from one version to the next.

    The trainer rewrites a slot file in place, so the same pages hold its next version:
    a map kept from before needs no page faults (1 GiB mapped afresh faults for about
    0.05 s). A map goes once its file is removed or replaced; its memory goes when the
    last tensor viewing it does.
    """

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self._maps: dict[Path, tuple[tuple[int, int], mmap.mmap]] = {}

    def get(self, path: Path, fd: int, length: int) -> mmap.mmap:
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        kept = self._maps.get(path)
        if kept is not None and kept[0] == key and len(kept[1]) >= length:
            return kept[1]
        for other, (other_key, _) in list(self._maps.items()):
            if other == path or _identity(other) != other_key:
                del self._maps[other]
        # Not MAP_POPULATE: faulting pages in as they are first read maps 16 at a time,
        # in whichever threads read them (1 GiB populated at once takes 0.14 s here).
        mapped = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        self._maps[path] = (key, mapped)
        while len(self._maps) > self.limit:
            del self._maps[next(iter(self._maps))]
        return mapped

    def clear(self) -> None:
        self._maps.clear()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def sweep(directory: Path) -> int:
    """Remove the slot files nobody holds (a dead trainer's); how many were removed."""
    removed = 0
    if not directory.is_dir():
        return 0
    for path in directory.iterdir():
        if not _NAME.match(path.name):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        else:
            path.unlink(missing_ok=True)
            removed += 1
        finally:
            os.close(fd)
    return removed


def trainer_of(path: Path) -> int | None:
    """The process that made slot file ``path`` (its name begins with its pid); None if
    ``path`` is no slot file's."""
    return int(path.name.split("-")[0]) if _NAME.match(path.name) else None


def new_slot_paths(directory: Path) -> Iterator[Path]:
    """For a trainer starting on ``directory``: make it, remove the files a trainer before
    it left (killed before it cleaned up), and name this process's slot files in turn."""
    private_directory(directory, "holds weight slot files")
    stale = sweep(directory)
    if stale:
        log.info("removed stale weight slot files", directory=str(directory), files=stale)
    return (directory / f"{os.getpid()}-{n}.weights" for n in itertools.count())
