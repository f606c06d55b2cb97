"""The child process of :mod:`.sandbox`: it finds the reward by name, then scores what it
is sent, one request at a time, until the worker closes the connection.

Run as ``python -m asyncrl.actors.tasks.sandbox_child FD PARENT_PID`` by the worker, with
the connection's end at descriptor FD. Its errors go back as text, the same text the
worker's own :class:`~.base.RewardFunction` would raise.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.runtime.contract.logs import configure_logging

from .base import RewardFunction, Sample, import_path, load_task
from .errors import TaskError
from .sandbox import RewardSource, SourceKind, receive, send

__all__ = ["main", "resolve"]

_PR_SET_PDEATHSIG = 1


def resolve(source: RewardSource) -> Callable[..., Any]:
    """The reward function ``source`` names."""
    if source.kind is SourceKind.MATH:
        from .math_reward import math_reward

        # Its first call imports sympy and builds its parsers: here, before the first
        # call's time starts.
        math_reward(Sample("", "1"), "1")
        return math_reward
    if source.kind is SourceKind.FUNCTION:
        function = import_path(source.path, "data.reward")
        if not callable(function):
            raise TaskError(f"data.reward={source.path!r}: not callable")
        return function
    return load_task(source.path).reward


def main(argv: Sequence[str] | None = None) -> int:
    fd, parent = (int(arg) for arg in (argv or sys.argv[1:]))
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when this ends
    # It warns at every call that its own timeouts are off: they are, on purpose (the
    # worker kills this process at the limit instead).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    sock = socket.socket(fileno=fd)
    hello = receive(sock)
    if hello is None:
        return 0
    sys.path[:] = hello["path"]  # plug-ins import as they do in the worker
    name = str(hello["name"])
    # What a reward logs (why a program scored 0, say) goes to the worker's log: this
    # process's stderr is the worker's, as JSON lines beside the worker's own.
    configure_logging(process="reward-child")
    try:
        kind, path = hello["source"]
        reward = RewardFunction(resolve(RewardSource(SourceKind(kind), path)), name)
    except Exception as error:  # said to the worker, which fails the call with it
        send(sock, {"error": f"reward {name!r} did not load: {type(error).__name__}: {error}"})
        return 1
    send(sock, {"ready": True})
    while (request := receive(sock)) is not None:
        send(sock, _answer(reward, request))
    return 0


def _answer(reward: RewardFunction, request: dict[str, Any]) -> dict[str, Any]:
    fields = request["sample"]
    if fields.get("messages") is not None:
        fields["messages"] = tuple(fields["messages"])
    try:
        return {"values": reward.score_all(Sample(**fields), request["responses"])}
    except TaskError as error:
        return {"error": str(error)}


def _die_with(parent: int) -> None:
    """SIGKILL when the worker dies, however it dies, even while a call is running."""
    # Not on Linux: the closed connection ends it instead, once its call returns.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the worker died before the request took effect
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
