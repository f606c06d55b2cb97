"""HTTP request bodies are bounded: the API server (uvicorn on loopback, real sockets)
answers 413 to a body over its limit without reading it, whether the body declares its
length or arrives chunked; the metrics endpoint reads no body at all."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from asyncrl.actors.serving.http_server import ApiServer

pytestmark = pytest.mark.timeout(30)

LIMIT = 4096


@pytest.fixture
def server() -> Iterator[tuple[ApiServer, list[int]]]:
    bodies: list[int] = []  # the length of each body the app read whole

    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        bodies.append(len(body))
        return JSONResponse({"read": len(body)})

    served = ApiServer(Starlette(routes=[Route("/echo", echo, methods=["POST"])]), "127.0.0.1",
                       max_body_bytes=LIMIT)  # fmt: skip
    served.start()
    try:
        yield served, bodies
    finally:
        served.stop()


def _connect(served: ApiServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", served.port), timeout=10)


def _reply(conn: socket.socket) -> bytes:
    """Everything the server sent until it closed the connection (a timeout if it never)."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_a_body_under_the_limit_is_read_and_served(server: tuple[ApiServer, list[int]]) -> None:
    served, bodies = server
    with _connect(served) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                     b"Connection: close\r\n\r\n" + b"a" * 100)  # fmt: skip
        data = _reply(conn)
    assert data.startswith(b"HTTP/1.1 200") and b'{"read":100}' in data
    assert bodies == [100]


def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_sent(
    server: tuple[ApiServer, list[int]],
) -> None:
    served, bodies = server
    with _connect(served) as conn:
        # A gigabyte announced, nothing sent: the reply cannot wait for it.
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        data = _reply(conn)
    assert data.startswith(b"HTTP/1.1 413"), data
    assert b"over 4096 bytes" in data and b"invalid_request_error" in data
    assert bodies == [] and served.body_limit.refused == 1


def test_a_chunked_body_is_refused_once_it_passes_the_limit(
    server: tuple[ApiServer, list[int]],
) -> None:
    served, bodies = server
    with _connect(served) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"b" * 1024
        for _ in range(LIMIT // len(chunk) + 1):
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        # The body never ends (no last chunk): only the limit can answer it.
        data = _reply(conn)
    assert data.startswith(b"HTTP/1.1 413"), data
    assert bodies == [] and served.body_limit.refused == 1
    # The server goes on serving.
    with _connect(served) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                     b"Connection: close\r\n\r\nok")  # fmt: skip
        assert _reply(conn).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("method", [b"GET", b"POST"])
def test_the_metrics_endpoint_answers_without_reading_a_body(method: bytes) -> None:
    # prometheus-client's server never reads a body and closes after each reply: bounded
    # as it is (its request line and headers are bounded by http.server).
    from asyncrl.runtime.scheduler.service.live_metrics import LiveMetrics, serve_metrics

    metrics = serve_metrics(LiveMetrics(None), "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        with socket.create_connection(("127.0.0.1", metrics.server_address[1]), timeout=10) as conn:
            conn.sendall(method + b" /metrics HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1000000000\r\n\r\n")  # fmt: skip
            data = _reply(conn)
        assert data.startswith(b"HTTP/1.0 200" if method == b"GET" else b"HTTP/1.0 405"), data
    finally:
        metrics.shutdown()
