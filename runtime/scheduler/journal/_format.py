"""Frame layout, file names and the corruption error shared by the reader and the writer."""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack

HEADER = struct.Struct("<II")  # payload length, crc32(payload); little endian
HEADER_SIZE = HEADER.size
# A bit flip in a length field must not pass for a torn tail, so absurd lengths are corruption.
MAX_RECORD_BYTES = 64 << 20
MAX_SNAPSHOT_BYTES = 0xFFFFFFFF
SEGMENT_RE = re.compile(r"journal-(\d{12,})\.log")
SNAPSHOT_RE = re.compile(r"snapshot-(\d{12,})\.msgpack")
LOCK_NAME = "lock"

PathLike = str | os.PathLike[str]


class JournalCorrupt(Exception):
    """The journal is damaged somewhere other than a torn tail; ``path``/``offset`` say where."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path} at byte {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


def segment_name(first_seq: int) -> str:
    return f"journal-{first_seq:012d}.log"


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:012d}.msgpack"


def frame_header(payload: bytes) -> bytes:
    return HEADER.pack(len(payload), zlib.crc32(payload))


def unpack(payload: bytes | memoryview) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def listing(root: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """(seq, path) of every file in ``root`` whose name matches ``pattern``, by seq."""
    found = []
    for entry in os.scandir(root):
        match = pattern.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)
