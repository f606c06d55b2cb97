"""Which connection speaks for a worker once the scheduler restarted and knows no
connections: with a run secret, only one carrying the worker's key."""

from __future__ import annotations

from asyncrl.runtime.service.connections import Connections
from asyncrl.transport import protocol as p
from asyncrl.transport.identity import connection_identity, worker_key

from .test_core import make_core

SECRET = b"s" * 32


def routing_id(name: str, key: bytes | None) -> bytes:
    return connection_identity(name, key).encode()


def test_after_a_restart_a_live_name_is_bound_only_with_its_key() -> None:
    guard = Connections(make_core(), SECRET)  # "gen" is live; nothing is bound yet
    beat = p.Heartbeat("gen", None)
    stranger = routing_id("gen", None)
    refused = guard.refusal(beat, stranger)
    assert refused is not None and refused.code == "wrong_sender"
    real = routing_id("gen", worker_key(SECRET, "gen"))
    assert guard.refusal(beat, real) is None
    refused = guard.refusal(beat, stranger)  # and now the name is the real one's
    assert refused is not None and refused.code == "wrong_sender"


def test_without_a_run_secret_the_first_connection_under_the_name_binds_it() -> None:
    guard = Connections(make_core(), None)
    first, second = routing_id("gen", None), routing_id("gen", None)
    beat = p.Heartbeat("gen", None)
    assert guard.refusal(beat, first) is None
    refused = guard.refusal(beat, second)
    assert refused is not None and refused.code == "wrong_sender"
