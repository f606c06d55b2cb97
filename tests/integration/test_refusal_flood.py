"""A flood of clients with random CURVE keys makes a bounded number of log lines: the
first few refusals as they are, then one sum per interval (a line each filled the disk)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import zmq

from asyncrl.transport.security import keygen, load_server_keys
from asyncrl.transport.sockets import bind_scheduler_sockets

STRANGERS = 150
LONG_S = 30.0


def test_a_flood_of_bad_keys_is_told_in_a_few_lines_and_a_sum(tmp_path: Path) -> None:
    keygen(tmp_path / "keys")
    server_keys = load_server_keys(tmp_path / "keys")
    ctx = zmq.Context()
    bound = bind_scheduler_sockets(
        ctx, "127.0.0.1", 0, 0, max_message_bytes=1 << 20, server_keys=server_keys
    )
    strangers: list[zmq.Socket] = []
    monitors: list[zmq.Socket] = []
    lines: list[str] = []
    try:
        for _ in range(STRANGERS):
            public, secret = zmq.curve_keypair()  # a fresh key each: no two lines alike
            stranger = ctx.socket(zmq.DEALER)
            stranger.setsockopt(zmq.LINGER, 0)
            stranger.setsockopt(zmq.CURVE_SERVERKEY, server_keys.public)
            stranger.setsockopt(zmq.CURVE_PUBLICKEY, public)
            stranger.setsockopt(zmq.CURVE_SECRETKEY, secret)
            monitors.append(stranger.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH))
            stranger.connect(bound.control_endpoint)
            strangers.append(stranger)
        refused: set[int] = set()  # strangers told they were refused
        deadline = time.monotonic() + LONG_S
        while len(refused) < STRANGERS and time.monotonic() < deadline:
            lines += bound.auth_failures()
            refused.update(i for i, m in enumerate(monitors) if m.poll(0))
            time.sleep(0.05)
        assert len(refused) == STRANGERS
        time.sleep(0.2)  # the server's monitors may trail its clients'
        lines += bound.auth_failures()
        # Within one interval (10 s by default): the first three, named, and nothing more.
        assert len(lines) <= 3, lines[:10]
        assert all("is not allowed" in line for line in lines)

        bound.refusals.interval_s = 0.0  # the interval is over
        (summary,) = bound.auth_failures()
        match = re.fullmatch(r"refused ([\d,]+) connections in \d+ s \(bad CURVE key\)", summary)
        assert match is not None, summary
        assert int(match[1].replace(",", "")) >= STRANGERS
    finally:
        for socket in (*monitors, *strangers):
            socket.close(linger=0)
        bound.close()
        ctx.term()
