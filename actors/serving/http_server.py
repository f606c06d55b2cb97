"""An ASGI app served by uvicorn on a thread of this process, on a port the OS picks.

Every request's body is bounded (``max_body_bytes``): one that says it is larger gets a
413 before a byte of it is read, one that turns out larger (chunked) a 413 once the limit
is passed; either way the connection is closed and the rest never read.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Any

import structlog
import uvicorn
from starlette.applications import Starlette

__all__ = ["MAX_BODY_BYTES", "ApiServer"]

log = structlog.get_logger("asyncrl.serving")

_START_S = 10.0
# Far above any request the API serves (a prompt longer than model.max_prompt_tokens is
# refused anyway: 128k tokens of JSON-escaped text is a few MB), far below what a few
# clients could make a worker hold at once.
MAX_BODY_BYTES = 16 << 20
_REFUSAL_LOG_EVERY_S = 10.0  # one line per period, with the count: a flood is one line


class ApiServer:
    """``app`` on ``host`` (a free port), served by its own thread and event loop."""

    def __init__(self, app: Starlette, host: str, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off only on sockets
        # that say they are TCP, and with it on each response's body waited for the
        # client's delayed ACK of its headers (40 ms a call, measured here, against 5).
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket.bind((host, 0))
        self.port = self._socket.getsockname()[1]
        # A wildcard address is no address to dial: name this host instead.
        reachable = socket.gethostname() if host in ("0.0.0.0", "::") else host
        self.url = f"http://{f'[{reachable}]' if ':' in reachable else reachable}:{self.port}"
        self.body_limit = BodyLimit(app, max_body_bytes)
        # No logging set-up of its own (the worker's entry point configured it); no access
        # log (one line per model call would drown the worker's).
        config = uvicorn.Config(
            self.body_limit,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="api-server"
        )
        self._thread.daemon = True  # never keeps a leaving worker alive

    def start(self) -> None:
        """Serve; return once the server accepts connections. RuntimeError if it cannot."""
        self._thread.start()
        deadline = time.monotonic() + _START_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API server on {self.url} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(_START_S)
        self._socket.close()


class _BodyTooLarge(Exception):
    """Raised into the app from ``receive`` once a body passes the limit."""


class BodyLimit:
    """ASGI middleware: ``app`` with its requests' bodies bounded to ``max_bytes``."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.refused = 0  # requests answered 413
        self._next_log = 0.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if _declared_length(scope) > self.max_bytes:
            return await self._refuse(scope, send)
        received, started, refused = 0, False, False

        async def bounded_receive() -> dict[str, Any]:
            nonlocal received, refused
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                refused = True
                raise _BodyTooLarge
            return message

        async def send_unless_refused(message: dict[str, Any]) -> None:
            nonlocal started
            if not refused:  # the app's reply to the error it was raised (a 500): dropped
                started = True
                await send(message)

        # Raised back out of the app (Starlette re-raises after its 500, dropped above), or
        # swallowed by it: refused either way.
        with contextlib.suppress(_BodyTooLarge):
            await self.app(scope, bounded_receive, send_unless_refused)
        if refused and not started:
            await self._refuse(scope, send)

    async def _refuse(self, scope: dict[str, Any], send: Any) -> None:
        self.refused += 1
        now = time.monotonic()
        if now >= self._next_log:
            self._next_log = now + _REFUSAL_LOG_EVERY_S
            client = scope.get("client") or ("?", 0)
            log.warning("refused an HTTP request body over the limit", path=scope.get("path"),
                        client=f"{client[0]}:{client[1]}", limit_bytes=self.max_bytes,
                        refused_so_far=self.refused)  # fmt: skip
        text = f"the request body is over {self.max_bytes} bytes"
        body = json.dumps({"error": {"message": text, "type": "invalid_request_error",
                                     "param": None, "code": None}}).encode()  # fmt: skip
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   # The rest of the body is never read: the connection cannot carry on.
                   (b"connection", b"close")]  # fmt: skip
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _declared_length(scope: dict[str, Any]) -> int:
    """The request's Content-Length, 0 without one (chunked; uvicorn refuses a bad one)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0
