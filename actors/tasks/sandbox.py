"""Scoring model output in a process that can be killed on a deadline.

Model output is code-like input, and a verifier may spend as long as it likes on it:
asked about ``\\boxed{9^{9^{9^{9}}}}``, math-verify computes the power in one C call
that holds the GIL, so no other thread of the process runs (the worker's heartbeats
included) and no thread-based time limit can fire. So a reward that a fresh process can
find again by name (the math verifier, a plug-in function, a task's own reward) is
called in a child process: the worker sends it the sample and the responses and waits,
the GIL released, at most ``timeout_s``. A child past that is killed with its process
group, counted and logged, and a fresh one is started at once for the next call; the call
fails with the reason, as any failing reward does (:class:`~.base.RewardFunction`).

The child is started at the first call and kept: a call costs a round trip over a socket
pair, not a process start. It gets the worker's environment without the ``ASYNCRL_*``
variables (its supervisor's channels), dies with the worker (PR_SET_PDEATHSIG) and
answers with data only: a few numbers or an error line, never a pickle.

Wire: each message is a 4-byte big-endian length, then MessagePack::

    worker -> child   {"path": sys.path, "source": [kind, path], "name": name}   once
    child -> worker   {"ready": true} or {"error": text}                         once
    worker -> child   {"sample": {field: value}, "responses": [text, ...]}
    child -> worker   {"values": [float, ...]} or {"error": text}
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack
import structlog

from .errors import TaskError

__all__ = ["RewardSource", "Sandbox", "SourceKind", "receive", "send"]

log = structlog.get_logger("asyncrl.reward")

_CHILD_MODULE = "asyncrl.actors.tasks.sandbox_child"
_START_TIMEOUT_S = 120.0  # for the child's imports (sympy's, for the math verifier)
_MAX_MESSAGE = 1 << 30  # a request holds a group's responses; a reply a few floats
_HEADER = struct.Struct(">I")
_PRIVATE_ENV = "ASYNCRL_"


class SourceKind(StrEnum):
    MATH = "math"  # the math verifier
    FUNCTION = "function"  # a plug-in ``f(sample, response)`` at an import path
    TASK = "task"  # the ``reward`` of the task at an import path


@dataclass(frozen=True, slots=True)
class RewardSource:
    """Where a fresh process finds the reward."""

    kind: SourceKind
    path: str = ""


class Sandbox:
    """Calls of one reward, one at a time, each in a child process for at most
    ``timeout_s`` (None or 0: no limit, but still out of the caller's process)."""

    def __init__(self, source: RewardSource, name: str, timeout_s: float | None) -> None:
        self.source = source
        self.name = name
        self.timeout_s = timeout_s or None
        self.killed = 0  # calls that ran out of time, each with its process
        self._lock = threading.Lock()  # one call at a time: the child answers in order
        self._slot: list[_Child] = []  # the current child, if any; shared with the finalizer
        weakref.finalize(self, _stop_all, self._slot)

    def score(self, sample: Any, responses: list[str]) -> list[float]:
        """The reward of each response, from the child; TaskError with the reason if it
        failed, or did not answer in time (then the child is killed and replaced)."""
        request = _pack({"sample": _fields(sample), "responses": responses}, self.name)
        with self._lock:
            child = self._ready_child()
            try:
                reply = child.ask(request, self.timeout_s)
            except TimeoutError:
                self.killed += 1
                why = f"still running after {self.timeout_s:g} s"
                log.warning(
                    "reward call ran out of time: its process is killed and replaced",
                    reward=self.name, pid=child.pid, why=why, killed=self.killed,
                )  # fmt: skip
                self._replace(child)
                raise TaskError(
                    f"reward {self.name!r} did not return: {why}; its process was killed"
                ) from None
            except _Gone as gone:
                log.warning(
                    "reward process ended in a call: replaced",
                    reward=self.name, pid=child.pid, why=str(gone),
                )  # fmt: skip
                self._replace(child)
                raise TaskError(f"reward {self.name!r}: its process {gone}") from None
        return self._values(reply, len(responses))

    @property
    def pid(self) -> int | None:
        """The child's process id; None before the first call."""
        return self._slot[0].pid if self._slot else None

    def close(self) -> None:
        with self._lock:
            _stop_all(self._slot)

    def _ready_child(self) -> _Child:
        if self._slot and self._slot[0].proc.poll() is not None:
            # It ended between calls (killed from outside, or with the thread that started
            # it: PR_SET_PDEATHSIG follows that thread): no call's fault, start another.
            ended = self._slot[0]
            log.warning("reward process ended", reward=self.name, pid=ended.pid)
            self._drop(ended)
        if not self._slot:
            self._slot.append(_Child.start(self.source, self.name))
        child = self._slot[0]
        if child.ready:
            return child
        try:
            hello = child.receive(time.monotonic() + _START_TIMEOUT_S)
        except TimeoutError:
            self._drop(child)
            message = f"its process did not start in {_START_TIMEOUT_S:g} s"
            raise TaskError(f"reward {self.name!r}: {message}") from None
        except _Gone as gone:
            self._drop(child)
            raise TaskError(f"reward {self.name!r}: its process {gone}") from None
        if not hello.get("ready"):
            self._drop(child)  # it could not load the reward; it says why and leaves
            raise TaskError(str(hello.get("error", f"reward {self.name!r}: no reward loaded")))
        child.ready = True
        return child

    def _replace(self, child: _Child) -> None:
        """Kill ``child`` and start the next one now: its imports overlap what the worker
        does until its next call."""
        self._drop(child)
        self._slot.append(_Child.start(self.source, self.name))

    def _drop(self, child: _Child) -> None:
        child.kill()
        self._slot.remove(child)

    def _values(self, reply: Mapping[str, Any], count: int) -> list[float]:
        if "error" in reply:
            raise TaskError(str(reply["error"]))
        values = reply.get("values")
        if not isinstance(values, list) or len(values) != count:
            raise TaskError(f"reward {self.name!r}: its process answered {reply!r:.200}")
        if not all(isinstance(value, float) for value in values):
            raise TaskError(f"reward {self.name!r}: its process answered {values!r:.200}")
        return values


class _Gone(Exception):
    """The child ended, or broke the wire, on its own."""


class _Child:
    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self.pid = proc.pid
        self.ready = False

    @classmethod
    def start(cls, source: RewardSource, name: str) -> _Child:
        ours, theirs = socket.socketpair()
        with theirs:
            proc = subprocess.Popen(
                [sys.executable, "-m", _CHILD_MODULE, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env={k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_ENV)},
                # Its own group: a kill takes whatever the reward started too.
                start_new_session=True,
            )
        child = cls(proc, ours)
        hello = {"path": sys.path, "source": [source.kind.value, source.path], "name": name}
        child.sock.sendall(_pack(hello, name))  # buffered until the child reads it
        return child

    def ask(self, request: bytes, timeout_s: float | None) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self.sock.settimeout(timeout_s)
            self.sock.sendall(request)
        except TimeoutError:
            raise
        except OSError as error:
            raise _Gone(self._ended(f"refused the request ({error})")) from None
        return self.receive(deadline)

    def receive(self, deadline: float | None) -> dict[str, Any]:
        (size,) = _HEADER.unpack(self._read(_HEADER.size, deadline))
        if size > _MAX_MESSAGE:
            raise _Gone(f"sent a message of {size} bytes")
        try:
            message = msgpack.unpackb(self._read(size, deadline), raw=False)
        except (ValueError, msgpack.UnpackException) as error:
            raise _Gone(f"sent what is not MessagePack ({error})") from None
        if not isinstance(message, dict):
            raise _Gone(f"sent {type(message).__name__}, not a map")
        return message

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
        self.sock.close()

    def _read(self, size: int, deadline: float | None) -> bytes:
        data = bytearray()
        while len(data) < size:
            self.sock.settimeout(
                None if deadline is None else max(0.0, deadline - time.monotonic())
            )
            try:
                chunk = self.sock.recv(size - len(data))
            except TimeoutError:
                raise
            except OSError as error:
                raise _Gone(self._ended(f"broke the connection ({error})")) from None
            if not chunk:
                raise _Gone(self._ended("closed the connection"))
            data += chunk
        return bytes(data)

    def _ended(self, what: str) -> str:
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return what
        if code < 0:
            return f"was ended by {signal.Signals(-code).name}"
        return f"exited with code {code}"


def _stop_all(slot: list[_Child]) -> None:
    while slot:
        slot.pop().kill()


def _fields(sample: Any) -> dict[str, Any]:
    return {field.name: getattr(sample, field.name) for field in dataclasses.fields(sample)}


def _pack(message: Mapping[str, Any], name: str) -> bytes:
    try:
        body = msgpack.packb(message, default=_plain, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as error:
        raise TaskError(
            f"reward {name!r}: cannot send the sample to its process: {error}"
        ) from None
    return _HEADER.pack(len(body)) + body


def _plain(value: Any) -> Any:
    """What MessagePack cannot take as it is: arrays and numbers of numpy (a Parquet
    row's extras), other mappings."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"a {type(value).__name__} in it")


def send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    """One message on the sandbox's wire (the child's side)."""
    sock.sendall(_pack(message, "sandbox"))


def receive(sock: socket.socket) -> dict[str, Any] | None:
    """The next message on the sandbox's wire, or None once the other side closed it."""
    header = _read_exactly(sock, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, _HEADER.unpack(header)[0])
    return None if body is None else msgpack.unpackb(body, raw=False, strict_map_key=False)


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return bytes(data)
