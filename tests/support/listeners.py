"""What a process listens on, read from the kernel (``/proc``), not from what it says."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

__all__ = ["listening"]


def listening(pid: int | str = "self") -> set[tuple[str, int]]:
    """The TCP addresses (host, port) process ``pid`` listens on, from its socket tables."""
    mine = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                mine.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in mine:  # 0A: LISTEN
                found.add(_address(fields[1], family))
    return found


def _address(hex_address: str, family: int) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)  # each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, raw), int(port, 16)
