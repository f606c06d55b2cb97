"""sockets.busy_poll: answers as soon as something is ready, gives up after its spin."""

from __future__ import annotations

import os
import time

import zmq

from asyncrl.transport.sockets import busy_poll


def test_a_ready_fd_is_answered_without_spinning_out_the_budget():
    read, write = os.pipe()
    try:
        os.write(write, b"x")
        start = time.perf_counter()
        ready = busy_poll([(read, zmq.POLLIN)], 5.0)
        assert time.perf_counter() - start < 1.0
        assert ready == [(read, zmq.POLLIN)]
    finally:
        os.close(read)
        os.close(write)


def test_nothing_ready_spins_for_the_budget_then_gives_up():
    read, write = os.pipe()
    try:
        start = time.perf_counter()
        assert busy_poll([(read, zmq.POLLIN)], 0.02) == []
        assert time.perf_counter() - start >= 0.02
    finally:
        os.close(read)
        os.close(write)


def test_a_zero_budget_does_not_poll_at_all():
    read, write = os.pipe()
    try:
        os.write(write, b"x")
        assert busy_poll([(read, zmq.POLLIN)], 0.0) == []  # the caller's blocking poll decides
    finally:
        os.close(read)
        os.close(write)


def test_a_socket_becoming_readable_mid_spin_is_seen():
    ctx = zmq.Context()
    try:
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.bind("inproc://busy")
        push.connect("inproc://busy")
        push.send(b"late")  # inproc delivers at once; the spin must report it
        ready = busy_poll([(pull, zmq.POLLIN)], 5.0)
        assert [events for _socket, events in ready] == [zmq.POLLIN]
        assert pull.recv() == b"late"
        pull.close(0)
        push.close(0)
    finally:
        ctx.term()
