"""The scheduler loop over real ZeroMQ sockets (inproc), with the journal's fsync gated.

What the loop promises about replies: a reply that lets a worker forget something waits
until the journal holds the records behind it, and replies leave in the order their
requests came; a lease, which owes nothing to the journal, leaves at once, and its record
still reaches the journal within the same turn.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.scheduler.service import service as service_module
from asyncrl.runtime.scheduler.service.assembly import open_service
from asyncrl.runtime.scheduler.service.daemon import SchedulerDaemon, _encoded
from asyncrl.transport import protocol as p
from asyncrl.transport.sockets import bind_scheduler_sockets_at

WAIT_MS = 5000


class Gate:
    """Stands in for os.fsync: each fsync waits until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()  # closed by the test once the run is set up
        self._fsync = os.fsync

    def __call__(self, fd: int) -> None:
        if not self.open.wait(30):
            raise TimeoutError("the test never opened the fsync gate")
        self._fsync(fd)


class Running:
    """The daemon, and one connection per worker (a worker speaks only for itself)."""

    def __init__(self, tmp_path: Path, ack_after: str, gate: Gate) -> None:
        cfg = config_from_dict(
            {
                "run": {"dir": str(tmp_path / "run"), "total_steps": 100},
                "pipeline": {"max_staleness": 1000, "train_batch_groups": 1},
                "scheduler": {"ack_after": ack_after, "busy_poll_us": 0},
            }
        )
        self.wake_fd = wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.service = open_service(
            cfg, resume=False, now=0.0, on_progress=lambda: os.eventfd_write(wake_fd, 1)
        )
        self.ctx = zmq.Context()
        self.sockets = bind_scheduler_sockets_at(
            self.ctx, "inproc://control", "inproc://events", max_message_bytes=2**20
        )
        self.daemon = SchedulerDaemon(
            self.service, self.sockets.control, self.sockets.events, wake_fd, ack_after=ack_after
        )
        self.clients: dict[str, zmq.Socket[Any]] = {}
        self.gate = gate
        self._ids = 0

    def close(self) -> None:
        for client in self.clients.values():
            client.close(linger=0)
        self.sockets.close()
        self.ctx.term()
        self.service.durable.close()
        self.service.close_files()
        os.close(self.wake_fd)

    def client(self, worker: str) -> zmq.Socket[Any]:
        if worker not in self.clients:
            socket = self.ctx.socket(zmq.DEALER)
            socket.setsockopt(zmq.IDENTITY, worker.encode())
            socket.connect("inproc://control")
            self.clients[worker] = socket
        return self.clients[worker]

    def send(self, message: p.Message) -> int:
        self._ids += 1
        self.client(message.worker).send_multipart(p.encode(message, self._ids))
        return self._ids

    def reply(self, timeout_ms: int = WAIT_MS, worker: str = "gen") -> tuple[p.Message, int] | None:
        if not self.client(worker).poll(timeout_ms):
            return None
        return p.decode_with_id(self.client(worker).recv_multipart())

    def call(self, message: p.Message) -> p.Message:
        sent = self.send(message)
        answer = self.reply(worker=message.worker)
        assert answer is not None, f"no reply to {message}"
        assert answer[1] == sent
        return answer[0]


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    gate = Gate()
    monkeypatch.setattr(os, "fsync", gate)
    run = Running(tmp_path, "fsync", gate)  # every held reply waits for the gated fsync
    daemon = run.daemon
    loop = threading.Thread(target=daemon.run, name="daemon", daemon=True)
    loop.start()
    try:
        assert isinstance(run.call(p.Hello("loader", "dataloader", p.PROTOCOL_VERSION, 1)), p.Ready)
        assert isinstance(run.call(p.Hello("gen", "generate", p.PROTOCOL_VERSION, 1)), p.Ready)
        run.call(p.LoadedVersion("gen", 0))
        groups = tuple(p.NewGroup(f"k{i}", {"x": i}) for i in range(4))
        assert isinstance(run.call(p.AddGroups("loader", groups)), p.Added)
        gate.open.clear()
        yield run
    finally:
        gate.open.set()
        daemon.request_stop()
        daemon.request_stop()
        loop.join(10)
        run.close()


def _result(lease: p.Lease) -> p.Result:
    return p.Result(lease.items[0].gid, {"tokens": np.arange(4, dtype=np.int32)}, (0, 0))


def test_a_lease_leaves_while_the_journal_is_stuck_and_its_record_follows(running: Running):
    writer = running.daemon.service.durable.writer
    before = writer.last_seq
    lease = running.call(p.Claim("gen", "generate", 1))  # the fsync gate is closed
    assert isinstance(lease, p.Lease)
    # The lease's record is journaled in the turn that sent it: the next reply proves the
    # turn is over.
    running.call(p.Heartbeat("gen"))
    assert writer.last_seq > before


def test_a_completion_waits_for_the_journal_and_later_replies_wait_behind_it(running: Running):
    lease = running.call(p.Claim("gen", "generate", 1))
    assert isinstance(lease, p.Lease)
    completed = running.send(p.Complete("gen", lease.lease_id, lease.fence, (_result(lease),)))
    claimed = running.send(p.Claim("gen", "generate", 1))
    assert running.reply(300) is None, "a reply left before the journal held the completion"
    running.gate.open.set()
    first, second = running.reply(), running.reply()
    assert first is not None and second is not None
    assert (first[1], second[1]) == (completed, claimed)
    assert isinstance(first[0], p.Ack) and isinstance(second[0], p.Lease)


def test_a_request_naming_another_worker_is_refused_and_changes_nothing(running: Running):
    lease = running.call(p.Claim("gen", "generate", 1))
    assert isinstance(lease, p.Lease)
    intruder = running.client("intruder")
    forged = [
        p.Fail("gen", lease.lease_id, lease.fence, None, "forged"),
        p.Bye("gen", "forged"),
        p.Hello("gen", "reward", p.PROTOCOL_VERSION, 1),
        p.Heartbeat("gen"),
    ]
    for n, message in enumerate(forged):
        intruder.send_multipart(p.encode(message, 1000 + n))
        assert intruder.poll(WAIT_MS)
        reply, _ = p.decode_with_id(intruder.recv_multipart())
        assert isinstance(reply, p.Error) and reply.code == "wrong_sender", reply
    # The real worker still holds its lease and completes it.
    running.gate.open.set()
    done = running.call(p.Complete("gen", lease.lease_id, lease.fence, (_result(lease),)))
    assert isinstance(done, p.Ack)
    assert running.daemon.service.core.rejections["wrong_sender"] == len(forged)


def test_a_request_the_scheduler_fails_on_is_an_error_and_the_loop_serves_on(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler with a bug (planted here: it raises) fails its own request with an
    internal Error; the loop answers the next requests as before."""

    def planted_bug(*_args: object) -> p.Message:
        raise RuntimeError("a planted bug in the report handler")

    handlers = service_module._HANDLERS
    original = handlers[p.Report]
    monkeypatch.setitem(handlers, p.Report, planted_bug)
    running.gate.open.set()
    failed = running.call(p.Report("gen", "validation", 0, {"val_reward": 1.0}))
    assert isinstance(failed, p.Error) and failed.code == "internal", failed
    assert isinstance(running.call(p.Claim("gen", "generate", 1)), p.Lease)
    monkeypatch.setitem(handlers, p.Report, original)  # the bug mended, the same loop
    assert isinstance(running.call(p.Report("gen", "validation", 0, {"val_reward": 1.0})), p.Ack)


def test_a_report_whose_data_json_cannot_hold_is_refused_naming_the_field(running: Running):
    running.gate.open.set()
    refused = running.call(p.Report("gen", "validation", 0, {"raw": b"\x00"}))
    assert isinstance(refused, p.Error) and refused.code == "bad_request", refused
    assert "field 'raw'" in refused.detail and "bytes" in refused.detail


def test_a_reply_that_cannot_be_encoded_is_sent_as_the_requests_error() -> None:
    frames = _encoded(p.StatusReply({"path": Path("/")}), 9, p.Kind.STATUS)
    reply, req_id = p.decode_with_id(frames)
    assert req_id == 9 and isinstance(reply, p.Error) and reply.code == "internal"


def test_a_held_reply_leaves_within_a_long_turn_not_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst makes a long turn; a completion read first in it is answered once the
    journal writes, about a millisecond on, not after every other request of the turn.
    Heartbeats made slow (2 ms each, planted) stretch the turn."""
    run = Running(tmp_path, "write", Gate())
    daemon, service = run.daemon, run.service

    def call(message: p.Message) -> p.Message:
        sent = run.send(message)
        daemon._serve_batch()
        service.durable.writer.submit(durable=False)  # as the turn's end does
        daemon._release()
        answer = run.reply(worker=message.worker)
        assert answer is not None and answer[1] == sent, message
        return answer[0]

    try:
        call(p.Hello("loader", "dataloader", p.PROTOCOL_VERSION, 1))
        call(p.Hello("gen", "generate", p.PROTOCOL_VERSION, 1))
        call(p.Hello("rw", "reward", p.PROTOCOL_VERSION, 1))
        call(p.LoadedVersion("gen", 0))
        call(p.AddGroups("loader", (p.NewGroup("k0", {"x": 0}),)))
        lease = call(p.Claim("gen", "generate", 1))
        assert isinstance(lease, p.Lease)
        answered: list[bool] = []  # at each heartbeat: had the completion's reply left?
        original = service_module._HANDLERS[p.Heartbeat]

        def slow_heartbeat(svc: Any, m: p.Heartbeat, now: float) -> p.Message:
            time.sleep(0.002)
            answered.append(run.client("gen").poll(0) != 0)
            return original(svc, m, now)

        monkeypatch.setitem(service_module._HANDLERS, p.Heartbeat, slow_heartbeat)
        run.send(p.Complete("gen", lease.lease_id, lease.fence, (_result(lease),)))
        for _ in range(8):
            run.send(p.Heartbeat("rw"))
        daemon._serve_batch()  # one turn: the completion, then eight heartbeats
        assert len(answered) == 8
        assert answered[0] is False  # held for the journal while under a millisecond
        assert answered[1] is True, answered  # written and sent within the turn
    finally:
        run.close()
