"""An ASGI app served by uvicorn on a thread of this process, on a port the OS picks."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette

__all__ = ["ApiServer"]

_START_S = 10.0


class ApiServer:
    """``app`` on ``host`` (a free port), served by its own thread and event loop."""

    def __init__(self, app: Starlette, host: str) -> None:
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
        # No logging set-up of its own (the worker's entry point configured it); no access
        # log (one line per model call would drown the worker's).
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=2
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
