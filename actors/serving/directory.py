"""Where the generators' APIs are: one small file per serving generator in the run dir.

A generator writes its entry when its server is up (atomically: a reader sees a whole
file or none), writes it again after each weight version it loads, and removes it when it
stops. A harness worker reads the entries to spread sessions over the live generators and
to know the oldest version they run (its staleness admission rests on it). An entry left
by a generator killed on this host is skipped by its pid; one from another host (another
``host_identity``: a container of the same name has pids of its own) is found out when
its connection fails (the session's group then fails and is tried again).
Entries carry the server's API key, so files and directory are owner-only; and they say
where a harness sends prompts and its key, so an entry is trusted only as the run's own:
a directory and files this user owns and nobody else may open, entries whole and naming
an http:// server (read_owned). Anything else is refused, with one log line per file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import structlog

from asyncrl.runtime.contract.rundir import UntrustedFile, read_owned
from asyncrl.transport.host import host_identity, process_alive

log = structlog.get_logger("asyncrl.serving")

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
        self._refused: set[str] = set()  # what was logged as refused, said once each

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
        found: list[ApiEntry] = []
        if not self._trusted_directory():
            return found
        for path in sorted(self.path.glob("*.json")):
            try:
                entry = _valid(path, _DECODER.decode(read_owned(path)))
            except FileNotFoundError:
                continue  # removed meanwhile
            except (OSError, UntrustedFile, ValueError, msgspec.DecodeError) as error:
                self._refuse(f"{path.name}: {error}")
                continue
            if entry.host == host_identity() and not process_alive(entry.pid):
                continue
            found.append(entry)
        return found

    def _trusted_directory(self) -> bool:
        try:
            info = self.path.lstat()
        except FileNotFoundError:
            return True  # no generator serves yet
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
            return True
        self._refuse(
            f"{self.path} is not a directory of this user's closed to others "
            f"(uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}): no entry trusted"
        )
        return False

    def _refuse(self, why: str) -> None:
        if why not in self._refused:
            self._refused.add(why)
            log.error("API server entry refused", reason=why)

    def _file(self, worker: str) -> Path:
        return self.path / _file_name(worker)


def _file_name(worker: str) -> str:
    return f"{worker.replace(os.sep, '_')}.json"


def _valid(path: Path, entry: ApiEntry) -> ApiEntry:
    """``entry`` if it is whole and names the worker its file is named after; ValueError
    naming what is wrong otherwise."""
    if _file_name(entry.worker) != path.name:
        raise ValueError(f"names worker {entry.worker!r}, not the one its file is for")
    parts = urlsplit(entry.url)
    if parts.scheme != "http" or not parts.hostname or parts.path or parts.query:
        raise ValueError(f"url {entry.url!r} is not http://HOST:PORT")
    try:
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        raise ValueError(f"url {entry.url!r} has no valid port") from None
    if entry.version < 0 or entry.pid <= 0 or not entry.key:
        raise ValueError("version, pid or key out of range")
    return entry
