"""Where the generators' APIs are: one small file per serving generator in the run dir.

A generator writes its entry when its server is up (atomically: a reader sees a whole
file or none), writes it again after each weight version it loads, and removes it when it
stops. A harness worker reads the entries to spread sessions over the live generators and
to know the oldest version they run (its staleness admission rests on it). An entry left
by a generator killed on this host is skipped by its pid; one from another host (another
``host_identity``: a container of the same name has pids of its own) is found out when
its connection fails (the session's group then fails and is tried again).
Entries carry the server's API key, so files and directory are owner-only.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from asyncrl.transport.host import host_identity, process_alive

__all__ = ["ApiDirectory", "ApiEntry"]


class ApiEntry(msgspec.Struct, frozen=True):
    """One generator's API: where, with what key, and the policy version it runs."""

    worker: str
    url: str  # http://HOST:PORT, no trailing slash
    key: str  # the bearer token its server wants
    version: int  # the policy version its decoder samples with (at least)
    pid: int
    host: str  # the host it runs on (its host_identity: where its pid means something)

    def session_url(self, session: str) -> str:
        """The ``base_url`` that binds an OpenAI client to ``session`` on this server."""
        return f"{self.url}/sessions/{session}/v1"

    def greedy_url(self, session: str) -> str:
        """The ``base_url`` of a greedy session (validation, a judge): calls decoded
        greedily, nothing recorded."""
        return f"{self.url}/greedy/{session}/v1"


_DECODER = msgspec.json.Decoder(ApiEntry)


class ApiDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path

    def publish(self, entry: ApiEntry) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        final = self._file(entry.worker)
        partial = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.encode(entry))
        os.replace(partial, final)

    def withdraw(self, worker: str) -> None:
        self._file(worker).unlink(missing_ok=True)

    def live(self) -> list[ApiEntry]:
        """The entries of generators that may be serving, by worker name."""
        found = []
        for path in sorted(self.path.glob("*.json")):
            try:
                entry = _DECODER.decode(path.read_bytes())
            except (OSError, ValueError, msgspec.DecodeError):  # ValueError: not UTF-8
                continue  # removed meanwhile, or not ours
            if entry.host == host_identity() and not process_alive(entry.pid):
                continue
            found.append(entry)
        return found

    def _file(self, worker: str) -> Path:
        return self.path / f"{worker.replace(os.sep, '_')}.json"
