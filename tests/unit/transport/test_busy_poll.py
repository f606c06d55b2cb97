"""sockets.busy_poll: answers as soon as something is ready, gives up after its spin."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import zmq

from asyncrl.transport.sockets import AdaptiveSpin, busy_poll


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    os.close(read)
    os.close(write)


def test_a_ready_fd_is_answered_without_spinning_out_the_budget(pipe):
    read, write = pipe
    os.write(write, b"x")
    start = time.perf_counter()
    assert busy_poll([(read, zmq.POLLIN)], 5.0) == [(read, zmq.POLLIN)]
    assert time.perf_counter() - start < 1.0


def test_nothing_ready_spins_for_the_budget_then_gives_up(pipe):
    read, _ = pipe
    start = time.perf_counter()
    assert busy_poll([(read, zmq.POLLIN)], 0.02) == []
    assert time.perf_counter() - start >= 0.02


def test_a_zero_budget_does_not_poll_at_all(pipe):
    read, write = pipe
    os.write(write, b"x")
    assert busy_poll([(read, zmq.POLLIN)], 0.0) == []  # the caller's blocking poll decides


def test_a_socket_with_a_message_waiting_is_seen():
    ctx = zmq.Context()
    try:
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.bind("inproc://busy")
        push.connect("inproc://busy")
        push.send(b"late")  # inproc delivers at once
        ready = busy_poll([(pull, zmq.POLLIN)], 5.0)
        assert [events for _socket, events in ready] == [zmq.POLLIN]
        assert pull.recv() == b"late"
        pull.close(0)
        push.close(0)
    finally:
        ctx.term()


def test_spinning_stops_while_requests_come_far_apart_and_resumes_when_they_come_close() -> None:
    spin = AdaptiveSpin(200e-6)
    assert spin.next_spin_s() == 200e-6  # until told otherwise, spinning pays
    for _ in range(20):
        spin.record(0.010)  # 10 ms apart: every spin would have timed out
    assert spin.next_spin_s() == 0.0
    for _ in range(5):
        spin.record(50e-6)  # back to back again: caught while sleeping, spin again
    assert spin.next_spin_s() == 200e-6
    assert AdaptiveSpin(0.0).next_spin_s() == 0.0
