"""ZmqLink against a real ROUTER and PUB: real sockets, real threads, CURVE included."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from asyncrl.transport.link import LinkClosed, LinkTimeout
from asyncrl.transport.protocol import (
    Ack,
    Claim,
    Complete,
    Event,
    Heartbeat,
    Message,
    NoWork,
    ProtocolError,
    Result,
    decode,
    encode,
    request_id,
)
from asyncrl.transport.security import ClientKeys, keygen, load_client_keys, load_server_keys
from asyncrl.transport.sockets import (
    BoundSockets,
    bind_scheduler_sockets,
    bind_scheduler_sockets_at,
    tcp_endpoint,
)
from asyncrl.transport.zmq_link import ZmqLink

pytestmark = pytest.mark.timeout(60)

MAX_BYTES = 1 << 20
SHORT_S = 0.4  # a timeout the tests expect to expire
LONG_S = 5.0  # a timeout the tests expect never to expire


def answer(message: Message) -> Message:
    """Claims get NoWork naming the claimer (so replies can be told apart); the rest Ack."""
    if isinstance(message, Claim):
        return NoWork(reason=message.worker)
    return Ack()


class AnswerServer:
    """A stand-in scheduler: its thread owns the ROUTER; while ``hold`` is set it keeps
    requests unanswered, and answers them (late) before the next request it serves, or
    once ``answer_held`` is set."""

    def __init__(self, bound: BoundSockets) -> None:
        self.bound = bound
        self.hold = threading.Event()
        self.answer_held = threading.Event()
        self.received: list[Message] = []
        self._held: list[tuple[bytes, Message, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        control = self.bound.control
        while not self._stop.is_set():
            if self.answer_held.is_set() and not self.hold.is_set():
                self.answer_held.clear()
                for held in self._held:
                    control.send_multipart([held[0], *encode(answer(held[1]), held[2])])
                self._held.clear()
            if not control.poll(20):
                continue
            identity, *frames = control.recv_multipart()
            try:
                message = decode(frames)
            except ProtocolError:
                continue
            self.received.append(message)
            req_id = request_id(frames)
            if self.hold.is_set():
                self._held.append((identity, message, req_id))
                continue
            for held in [*self._held, (identity, message, req_id)]:
                control.send_multipart([held[0], *encode(answer(held[1]), held[2])])
            self._held.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.bound.close()


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def serve(ctx: zmq.Context) -> Iterator[Callable[..., AnswerServer]]:
    servers: list[AnswerServer] = []

    def start(**options) -> AnswerServer:
        options.setdefault("max_message_bytes", MAX_BYTES)
        host_ports = options.pop("at", ("127.0.0.1", 0, 0))
        if isinstance(host_ports[0], str) and host_ports[0].startswith("ipc://"):
            bound = bind_scheduler_sockets_at(ctx, *host_ports, **options)
        else:
            bound = bind_scheduler_sockets(ctx, *host_ports, **options)
        servers.append(AnswerServer(bound))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def links() -> Iterator[Callable[..., ZmqLink]]:
    made: list[ZmqLink] = []

    def connect(server: AnswerServer, identity: str = "w1", **options) -> ZmqLink:
        bound = server.bound
        made.append(
            ZmqLink(bound.control_endpoint, bound.events_endpoint, identity=identity, **options)
        )
        return made[-1]

    yield connect
    for link in made:
        link.close()


def restart(serve, old: AnswerServer, **options) -> AnswerServer:
    """A new server on the ports of ``old`` (stopped first), as a restarted scheduler."""
    old.stop()
    ports = [
        int(e.rsplit(":", 1)[1]) for e in (old.bound.control_endpoint, old.bound.events_endpoint)
    ]
    deadline = time.monotonic() + LONG_S
    while True:  # libzmq's own thread closes the old listener, soon but not at once
        try:
            return serve(at=("127.0.0.1", *ports), **options)
        except zmq.ZMQError:
            assert time.monotonic() < deadline, "the old ports never came free"
            time.sleep(0.05)


def wait_for(condition: Callable[[], object], timeout_s: float = LONG_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.01)


# --- requests and replies ---------------------------------------------------------------


@pytest.mark.parametrize(("host", "dialled"), [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")])
def test_round_trip_over_tcp_on_a_free_port(serve, links, host, dialled):
    try:
        server = serve(at=(host, 0, 0))
    except zmq.ZMQError as error:
        pytest.skip(f"cannot bind {host}: {error}")
    assert server.bound.control_endpoint.startswith(f"tcp://{dialled}:")
    assert not server.bound.control_endpoint.endswith((":0", ":*"))
    link = links(server)
    assert link.request(Claim("w1", "generate", 2), LONG_S) == NoWork("w1")
    assert link.request(Heartbeat("w1"), LONG_S) == Ack()
    assert server.received == [Claim("w1", "generate", 2), Heartbeat("w1")]


def test_round_trip_over_ipc(serve, links, tmp_path):
    server = serve(at=(f"ipc://{tmp_path}/control", f"ipc://{tmp_path}/events"))
    assert server.bound.control_endpoint == f"ipc://{tmp_path}/control"
    link = links(server)
    assert link.request(Claim("w1", "generate", 1), LONG_S) == NoWork("w1")


def test_threads_sharing_a_link_each_get_their_own_replies(serve, links):
    link = links(serve())
    wrong: list[tuple[str, Message]] = []

    def claim_many(name: str) -> None:
        for _ in range(50):
            reply = link.request(Claim(name, "generate", 1), LONG_S)
            if reply != NoWork(name):
                wrong.append((name, reply))

    threads = [threading.Thread(target=claim_many, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert wrong == []


def test_a_timeout_reconnects_and_the_late_reply_goes_to_the_callback(serve, links):
    server = serve()
    late: list[Message] = []
    link = links(server, on_late_reply=late.append)
    assert link.request(Claim("warm-up", "generate", 1), LONG_S) == NoWork("warm-up")

    server.hold.set()
    with pytest.raises(LinkTimeout, match="Claim"):
        link.request(Claim("early", "generate", 1), SHORT_S)
    server.hold.clear()
    # The server now answers the held claim first, then this one, on the new connection.
    assert link.request(Claim("next", "generate", 1), LONG_S) == NoWork("next")
    wait_for(lambda: late)
    assert late == [NoWork("early")]


def test_a_late_reply_reaches_the_callback_without_waiting_for_another_request(serve, links):
    server = serve()
    late: list[Message] = []
    link = links(server, on_late_reply=late.append)
    server.hold.set()
    with pytest.raises(LinkTimeout):
        link.request(Claim("early", "generate", 1), SHORT_S)
    server.hold.clear()
    # The link dialled again after the timeout; the late reply can only be routed to the
    # new connection once it is up (a reply with no route is dropped), so give it time.
    time.sleep(0.5)
    server.answer_held.set()  # the reply comes now, and no request follows it
    wait_for(lambda: late)
    assert late == [NoWork("early")]
    # Once a later request has had its reply, calls are made on the caller's thread again.
    assert link.request(Claim("next", "generate", 1), LONG_S) == NoWork("next")
    assert link.request(Claim("then", "generate", 1), LONG_S) == NoWork("then")


def test_a_busy_polling_link_gets_quick_replies_slow_replies_and_timeouts(serve, links):
    server = serve()
    late: list[Message] = []
    link = links(server, busy_poll_s=0.002, on_late_reply=late.append)
    for n in range(20):  # answered within the spin, mostly
        assert link.request(Claim(f"quick{n}", "generate", 1), LONG_S) == NoWork(f"quick{n}")
    server.hold.set()
    with pytest.raises(LinkTimeout):  # the spin ends; the deadline still holds
        link.request(Claim("held", "generate", 1), SHORT_S)
    server.hold.clear()
    assert link.request(Claim("after", "generate", 1), LONG_S) == NoWork("after")
    wait_for(lambda: late)
    assert late == [NoWork("held")]

    def answer_later() -> None:
        time.sleep(0.3)  # long after the spin: the caller is asleep in poll by now
        server.hold.clear()
        server.answer_held.set()

    server.hold.set()
    threading.Thread(target=answer_later).start()
    assert link.request(Claim("slow", "generate", 1), LONG_S) == NoWork("slow")


def test_requests_overlapping_a_slow_one_are_answered_in_turn(serve, links):
    """One thread's call holds the socket; the others go through the I/O thread."""
    server = serve()
    link = links(server)
    server.hold.set()
    replies: dict[str, Message] = {}

    def claim(name: str) -> None:
        replies[name] = link.request(Claim(name, "generate", 1), LONG_S)

    first = threading.Thread(target=claim, args=("first",))
    first.start()
    wait_for(lambda: len(server.received) == 1)
    others = [threading.Thread(target=claim, args=(f"t{i}",)) for i in range(3)]
    for thread in others:
        thread.start()
    time.sleep(0.1)
    server.hold.clear()
    server.answer_held.set()
    for thread in [first, *others]:
        thread.join(LONG_S)
    assert replies == {name: NoWork(name) for name in ["first", "t0", "t1", "t2"]}


def test_a_restarted_server_on_the_same_port_is_reached_again(serve, links):
    first = serve()
    link = links(first)
    assert link.request(Heartbeat("w1"), LONG_S) == Ack()
    port = int(first.bound.control_endpoint.rsplit(":", 1)[1])
    second = restart(serve, first)
    assert second.bound.control_endpoint == tcp_endpoint("127.0.0.1", port)
    assert request_eventually(link, Claim("w1", "generate", 1)) == NoWork("w1")
    assert second.received[-1] == Claim("w1", "generate", 1)


def test_a_request_that_timed_out_is_never_delivered_to_a_later_server(serve, links):
    gone = serve()
    gone.stop()
    link = links(gone)  # dials the endpoints where nobody listens any more
    with pytest.raises(LinkTimeout):
        link.request(Claim("stale", "generate", 1), SHORT_S)

    server = restart(serve, gone)
    assert request_eventually(link, Claim("fresh", "generate", 1)) == NoWork("fresh")
    time.sleep(0.2)  # room for a stale copy to arrive, if one were still queued
    assert server.received == [Claim("fresh", "generate", 1)]


def closed_under(serve, server: AnswerServer, link: ZmqLink, claim: Claim) -> AnswerServer:
    """Send ``claim`` (held by ``server``) on another thread, restart ``server`` under it,
    and check that the call ended at once because its connection closed; the new server."""
    ended: list[float] = []

    def call() -> None:
        started = time.monotonic()
        with pytest.raises(LinkTimeout, match="connection to the scheduler closed"):
            link.request(claim, 60.0)
        ended.append(time.monotonic() - started)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: server.received[-1:] == [claim])
    second = restart(serve, server)  # closes the first server's sockets: the connection
    caller.join(LONG_S)
    assert ended and ended[0] < LONG_S
    return second


def test_a_call_whose_connection_closes_ends_at_once_not_at_its_deadline(serve, links):
    """A scheduler killed with a request in hand never answers it; its successor is up
    in a second or two, so waiting out a 5 s timeout per request stalls the whole run."""
    server = serve()
    link = links(server)
    assert link.request(Heartbeat("w1"), LONG_S) == Ack()
    server.hold.set()
    second = closed_under(serve, server, link, Claim("w1", "generate", 1))
    assert request_eventually(link, Claim("w1", "generate", 2)) == NoWork("w1")
    assert Claim("w1", "generate", 1) not in second.received


def test_a_call_on_the_io_thread_ends_at_once_when_its_connection_closes(serve, links):
    server = serve()
    link = links(server)
    server.hold.set()
    with pytest.raises(LinkTimeout):  # a late reply may come now: the I/O thread holds on
        link.request(Claim("w1", "generate", 1), SHORT_S)
    closed_under(serve, server, link, Claim("w1", "generate", 2))


def request_eventually(link: ZmqLink, message: Message, attempts: int = 3) -> Message:
    """As a worker does: a request sent while the old connection was dying may be lost."""
    for _ in range(attempts - 1):
        try:
            return link.request(message, 0.5)
        except LinkTimeout:
            pass
    return link.request(message, LONG_S)


def test_a_message_over_the_size_limit_is_dropped_and_the_server_goes_on(serve, links):
    server = serve()
    link = links(server, max_message_bytes=8 * MAX_BYTES)
    big = Complete("w1", 1, 1, (Result(0, {"logprobs": np.zeros(MAX_BYTES, np.float32)}),))
    with pytest.raises(LinkTimeout):
        link.request(big, SHORT_S)
    assert link.request(Heartbeat("w1"), LONG_S) == Ack()
    assert links(server, identity="w2").request(Claim("w2", "generate", 1), LONG_S) == NoWork("w2")
    assert not any(isinstance(m, Complete) for m in server.received)


def test_close_fails_waiting_requests_and_later_calls(serve, links):
    server = serve()
    link = links(server)
    server.hold.set()
    failures: list[BaseException] = []

    def wait_for_reply() -> None:
        try:
            link.request(Heartbeat("w1"), LONG_S)
        except BaseException as error:
            failures.append(error)

    waiter = threading.Thread(target=wait_for_reply)
    waiter.start()
    wait_for(lambda: server.received)
    link.close()
    waiter.join(LONG_S)
    assert [type(f) for f in failures] == [LinkClosed]
    with pytest.raises(LinkClosed):
        link.request(Heartbeat("w1"), LONG_S)
    with pytest.raises(LinkClosed):
        link.next_event(0)
    link.close()  # again: nothing happens


# --- events -----------------------------------------------------------------------------


def publish(bound: BoundSockets, seq: int, topic: str) -> None:
    bound.events.send_multipart([topic.encode(), *encode(Event(seq, topic, {"n": seq}))])


def publish_until_heard(bound: BoundSockets, link: ZmqLink, topic: str) -> None:
    """Subscriptions reach the PUB a moment after connecting: publish until one arrives."""
    for seq in range(1, 500):
        publish(bound, seq, topic)
        if link.next_event(0.02) is not None:
            return
    raise AssertionError("no event ever arrived")


def collect_until(link: ZmqLink, last_seq: int) -> list[Event]:
    seen = []
    while not seen or seen[-1].seq != last_seq:
        event = link.next_event(LONG_S)
        assert event is not None, f"events stopped after {seen}"
        seen.append(event)
    return seen


def test_events_reach_a_subscriber_for_its_prefixes_only(serve, links):
    server = serve()
    link = links(server)
    link.subscribe(["transition.", "version"])
    publish_until_heard(server.bound, link, "transition.warm.up")
    for seq, topic in enumerate(["lock.granted", "version.published", "transition.a.b"], 1000):
        publish(server.bound, seq, topic)
    heard = [e for e in collect_until(link, 1002) if e.topic != "transition.warm.up"]
    assert [(e.seq, e.topic, e.body) for e in heard] == [
        (1001, "version.published", {"n": 1001}),
        (1002, "transition.a.b", {"n": 1002}),
    ]
    assert link.next_event(0.1) is None


def test_a_full_event_buffer_drops_the_oldest(serve, links):
    server = serve()
    link = links(server, event_buffer=3)
    link.subscribe([""])
    publish_until_heard(server.bound, link, "warm")
    time.sleep(0.1)
    while link.next_event(0.05) is not None:  # late warm-up copies
        pass
    for seq in range(1000, 1010):
        publish(server.bound, seq, "burst")
    wait_for(lambda: link.dropped_events >= 7)
    assert [link.next_event(LONG_S).seq for _ in range(3)] == [1007, 1008, 1009]


# --- CURVE ------------------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    keygen(tmp_path / "keys")
    return tmp_path / "keys"


def curve_server(serve, keys: Path) -> AnswerServer:
    # Loopback would not need CURVE by default; it is forced on here as with curve: on.
    return serve(server_keys=load_server_keys(keys))


def failures_mentioning(server: AnswerServer, words: str) -> list[str]:
    found: list[str] = []
    deadline = time.monotonic() + LONG_S
    while not any(words in text for text in found) and time.monotonic() < deadline:
        found += server.bound.auth_failures()
        time.sleep(0.02)
    return found


def test_curve_client_with_the_right_keys_is_answered(serve, links, keys):
    server = curve_server(serve, keys)
    link = links(server, client_keys=load_client_keys(keys))
    assert link.request(Claim("w1", "generate", 1), LONG_S) == NoWork("w1")
    link.subscribe(["version"])
    publish_until_heard(server.bound, link, "version.published")
    assert server.bound.auth_failures() == []


def test_curve_client_with_an_unknown_key_pair_is_refused(serve, links, keys, tmp_path):
    server = curve_server(serve, keys)
    keygen(tmp_path / "other")
    stranger = load_client_keys(tmp_path / "other")
    wrong_pair = ClientKeys(stranger.public, stranger.secret, load_client_keys(keys).server_public)
    link = links(server, client_keys=wrong_pair)
    with pytest.raises(LinkTimeout):
        link.request(Claim("w1", "generate", 1), SHORT_S)
    found = failures_mentioning(server, stranger.public.decode())
    assert any(f"key {stranger.public.decode()} is not allowed" in text for text in found), found
    assert stranger.secret.decode() not in "".join(found)
    assert server.received == []


def test_curve_client_with_the_wrong_server_key_is_refused(serve, links, keys, tmp_path):
    server = curve_server(serve, keys)
    keygen(tmp_path / "other")
    link = links(server, client_keys=load_client_keys(tmp_path / "other"))
    with pytest.raises(LinkTimeout):
        link.request(Claim("w1", "generate", 1), SHORT_S)
    assert any("CRYPTOGRAPHIC" in text for text in failures_mentioning(server, "CRYPTOGRAPHIC"))
    assert server.received == []


def test_a_refused_client_gets_in_once_the_server_allows_it(serve, links, keys):
    # libzmq gives up on a connection whose handshake was refused; only the fresh socket
    # the link dials after a timeout tries again.
    strict = serve(server_keys=load_server_keys(keys), allowed_client_keys=[])
    link = links(strict, client_keys=load_client_keys(keys))
    with pytest.raises(LinkTimeout):
        link.request(Claim("w1", "generate", 1), SHORT_S)
    assert failures_mentioning(strict, "not allowed")
    restart(serve, strict, server_keys=load_server_keys(keys))
    assert request_eventually(link, Claim("w1", "generate", 1)) == NoWork("w1")


def test_a_client_without_keys_is_refused_by_a_curve_server(serve, links, keys):
    server = curve_server(serve, keys)
    link = links(server)
    with pytest.raises(LinkTimeout):
        link.request(Claim("w1", "generate", 1), SHORT_S)
    # Whichever side notices the mismatch first hangs up, so the server sees either.
    found = failures_mentioning(server, "handshake")
    assert any("MECHANISM_MISMATCH" in text or "no detail" in text for text in found), found
    assert server.received == []
