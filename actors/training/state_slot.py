"""One slot file holding one step of a trainer rank's state: named tensors as raw bytes.

Layout: a 4 KiB header page, then a JSON table of the tensors (name, dtype, shape,
offset), then the tensors' bytes, each at a 64-byte aligned offset. The header says
which step the file holds, how long the table and the bytes are, and their CRC-32C.

A write can be cut anywhere by a SIGKILL, so a slot is believed only through its header,
and the header is made valid last: a write first marks the header as being written (step
-1), then copies the bytes, then writes the step, lengths and checksum in one ``pwrite``
of under 64 bytes (a syscall the kill cannot split). Writes go to the page cache of a
RAM-backed file: what a killed process wrote stays written, so no fsync is needed; a
lost host loses the file anyway. A reader also checks the checksum, so bytes that
changed under a valid header (a bug, a stray writer) are refused too.

The file is sized once (``posix_fallocate``) and mapped once; each step rewrites it in
place, so staging a step allocates nothing.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c
import torch

from asyncrl.transport.host import NoPages, reserve_pages

__all__ = ["Entry", "NoRoom", "SlotFile", "checksum", "layout"]

HEADER_BYTES = 4096
_MAGIC = b"asyncrlT"
_FORMAT = 1
# magic, format, step (-1: being written), table bytes, data bytes, crc of table+data,
# crc of the fields before it (a header torn by a bug is refused, not misread).
_HEADER = struct.Struct("<8sIqQQI")
_HEADER_CRC = struct.Struct("<I")
_WRITING = -1
_ALIGN = 64
_CHUNK = 8 << 20  # copy and checksum this much at a time, so the checksum reads from cache


class NoRoom(OSError):
    """The directory cannot hold the slot; says how much was needed and how much is free."""


@dataclass(frozen=True, slots=True)
class Entry:
    """Where one tensor's bytes lie in a slot, and what they are."""

    name: str
    dtype: str  # torch dtype name without "torch."
    shape: tuple[int, ...]
    offset: int  # from the start of the data
    nbytes: int
    device: str  # the device type it came from ("cpu", "cuda"), to put it back there

    def as_json(self) -> list:
        return [self.name, self.dtype, list(self.shape), self.offset, self.nbytes, self.device]

    @classmethod
    def of_json(cls, row: list) -> Entry:
        name, dtype, shape, offset, nbytes, device = row
        return cls(name, dtype, tuple(shape), offset, nbytes, device)


def layout(tensors: Mapping[str, torch.Tensor]) -> tuple[Entry, ...]:
    """Where each tensor of a state goes in a slot (the same for every step of a learner)."""
    entries, offset = [], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        dtype = str(t.dtype).removeprefix("torch.")
        entries.append(Entry(name, dtype, tuple(t.shape), offset, nbytes, t.device.type))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return tuple(entries)


def _table(entries: Sequence[Entry], meta: Mapping[str, object]) -> bytes:
    return json.dumps({"meta": dict(meta), "tensors": [e.as_json() for e in entries]}).encode()


class SlotFile:
    """One slot file, open for reading and writing; :meth:`write` reuses its pages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        # Held while open: `asyncrl clean` removes only the staged state nobody holds.
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        self._map: mmap.mmap | None = None
        self.capacity = 0

    # --- reading ---------------------------------------------------------------------

    def step(self) -> int | None:
        """The step the header claims, or None when it claims none (being written, torn,
        empty, another format). Cheap: the bytes are not checked (see :meth:`verified`)."""
        raw = os.pread(self.fd, _HEADER.size + _HEADER_CRC.size, 0)
        if len(raw) < _HEADER.size + _HEADER_CRC.size:
            return None
        fields, (check,) = raw[: _HEADER.size], _HEADER_CRC.unpack(raw[_HEADER.size :])
        magic, fmt, step, table, data, _ = _HEADER.unpack(fields)
        if magic != _MAGIC or fmt != _FORMAT or step < 0 or crc32c.crc32c(fields) != check:
            return None
        if os.fstat(self.fd).st_size < HEADER_BYTES + _table_span(table) + data:
            return None
        return step

    def verified(self) -> tuple[int, dict, tuple[Entry, ...], int] | None:
        """(step, meta, entries, checksum) if the header is valid and the bytes match its
        checksum."""
        step = self.step()
        if step is None:
            return None
        _, _, _, table_len, data_len, crc = _HEADER.unpack(os.pread(self.fd, _HEADER.size, 0))
        end = HEADER_BYTES + _table_span(table_len) + data_len
        with self._view(end) as view:
            value = 0
            for start in range(HEADER_BYTES, end, _CHUNK):
                value = crc32c.crc32c(view[start : min(end, start + _CHUNK)], value)
            raw_table = bytes(view[HEADER_BYTES : HEADER_BYTES + table_len])
        if value != crc:
            return None
        try:
            table = json.loads(raw_table)
            entries = tuple(Entry.of_json(row) for row in table["tensors"])
        except (ValueError, KeyError, TypeError):
            return None
        return step, table["meta"], entries, crc

    def tensor(self, entry: Entry, table_len: int) -> torch.Tensor:
        """A CPU view of one tensor's bytes in the map (valid until the next write)."""
        start = HEADER_BYTES + _table_span(table_len) + entry.offset
        dtype = getattr(torch, entry.dtype)
        if entry.nbytes == 0:
            return torch.empty(entry.shape, dtype=dtype)
        assert self._map is not None
        raw = torch.frombuffer(self._map, dtype=torch.uint8, count=entry.nbytes, offset=start)
        return raw.view(dtype).reshape(entry.shape)

    def table_len(self) -> int:
        return _HEADER.unpack(os.pread(self.fd, _HEADER.size, 0))[3]

    # --- writing ---------------------------------------------------------------------

    def reserve(self, entries: Sequence[Entry], meta: Mapping[str, object]) -> None:
        """Make the file big enough for a state of ``entries`` (once; later steps reuse it).

        The pages are allocated now: a page a full tmpfs cannot give would kill the
        writer with SIGBUS in the middle of a step."""
        size = _size(entries, len(_table(entries, meta)))
        if size <= self.capacity:
            return
        try:
            reserve_pages(self.fd, size, self.path.parent)
        except NoPages as full:
            raise NoRoom(
                f"staging the trainer's state needs {_mib(size)} MiB per slot (two per "
                f"rank) in {self.path.parent}, which has {_mib(full.free_bytes)} MiB free; "
                f"give it more room (a container's --shm-size)"
            ) from None
        # Populated now: faulting 1 GiB of fresh pages in takes seconds, at start, not
        # inside the first step.
        self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        self.capacity = size

    def write(
        self,
        step: int,
        tensors: Mapping[str, torch.Tensor],
        entries: Sequence[Entry],
        meta: Mapping[str, object],
    ) -> int:
        """Put ``tensors`` (laid out as ``entries``) in the file as ``step``'s state; the
        checksum it recorded (:func:`checksum` of the same)."""
        table = _table(entries, meta)
        self.reserve(entries, meta)
        assert self._map is not None
        # Invalid from here until the last pwrite: a kill in between leaves no valid slot.
        os.pwrite(self.fd, _header(_WRITING, 0, 0, 0), 0)
        data_at = HEADER_BYTES + _table_span(len(table))
        self._map[HEADER_BYTES : HEADER_BYTES + len(table)] = table
        # The checksum covers every byte from the table to the last tensor's end, the
        # padding between them included (what fallocate zeroed and nothing writes).
        value, done = 0, HEADER_BYTES
        with memoryview(self._map) as view:
            for entry in entries:
                at = data_at + entry.offset
                value = crc32c.crc32c(view[done:at], value)
                value = self._copy(tensors[entry.name], at, entry, value, view)
                done = at + entry.nbytes
            value = crc32c.crc32c(view[done : data_at + _data_len(entries)], value)
        os.pwrite(self.fd, _header(step, len(table), _data_len(entries), value), 0)
        return value

    def _copy(
        self, source: torch.Tensor, at: int, entry: Entry, value: int, view: memoryview
    ) -> int:
        if tuple(source.shape) != entry.shape or str(source.dtype) != f"torch.{entry.dtype}":
            raise ValueError(f"{entry.name}: {tuple(source.shape)} {source.dtype}, not {entry}")
        if entry.nbytes == 0:
            return value
        raw = source.detach().contiguous().reshape(-1).view(torch.uint8)
        target = torch.frombuffer(self._map, dtype=torch.uint8, count=entry.nbytes, offset=at)
        for start in range(0, entry.nbytes, _CHUNK):
            end = min(entry.nbytes, start + _CHUNK)
            target[start:end].copy_(raw[start:end])
            value = crc32c.crc32c(view[at + start : at + end], value)
        return value

    # --- the file ----------------------------------------------------------------------

    def close(self) -> None:
        # The map itself goes when the last tensor viewing it does.
        self._map = None
        os.close(self.fd)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.close()

    def _view(self, size: int) -> memoryview:
        if self._map is None or len(self._map) < size:
            self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
            self.capacity = size
        return memoryview(self._map)


def checksum(
    tensors: Mapping[str, torch.Tensor], entries: Sequence[Entry], meta: Mapping[str, object]
) -> int:
    """The checksum :meth:`SlotFile.write` records for ``tensors``, computed without
    writing: to check that a state taken up from a slot is bit for bit the one staged."""
    table = _table(entries, meta)
    value, done = crc32c.crc32c(table), HEADER_BYTES + len(table)
    data_at = HEADER_BYTES + _table_span(len(table))
    for entry in entries:
        at = data_at + entry.offset
        value = crc32c.crc32c(bytes(at - done), value)  # padding: zeros, never written
        raw = tensors[entry.name].detach().contiguous().reshape(-1).view(torch.uint8)
        value = crc32c.crc32c(raw.cpu().numpy(), value)
        done = at + entry.nbytes
    return crc32c.crc32c(bytes(data_at + _data_len(entries) - done), value)


def _header(step: int, table: int, data: int, crc: int) -> bytes:
    fields = _HEADER.pack(_MAGIC, _FORMAT, step, table, data, crc)
    return fields + _HEADER_CRC.pack(crc32c.crc32c(fields))


def _table_span(table_len: int) -> int:
    """The table and its padding: the data starts on a page, so every tensor is aligned."""
    return -(-table_len // HEADER_BYTES) * HEADER_BYTES


def _data_len(entries: Sequence[Entry]) -> int:
    return entries[-1].offset + entries[-1].nbytes if entries else 0


def _size(entries: Sequence[Entry], table_len: int) -> int:
    return HEADER_BYTES + _table_span(table_len) + _data_len(entries)


def _mib(nbytes: int) -> int:
    return -(-nbytes // (1 << 20))
