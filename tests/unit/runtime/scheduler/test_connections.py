"""Which connection speaks for a worker: with a run secret, only one carrying the worker
key of its name and role (at registration, and once the scheduler restarted and knows no
connections)."""

from __future__ import annotations

from asyncrl.runtime.scheduler.service.connections import Connections
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
    real = routing_id("gen", worker_key(SECRET, "gen", "generate"))
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


def test_a_worker_key_registers_only_its_own_name_and_role() -> None:
    guard = Connections(make_core(), SECRET)
    mine = routing_id("new", worker_key(SECRET, "new", "generate"))
    for role in ("dataloader", "train", "logp"):
        refused = guard.refusal(p.Hello("new", role, p.PROTOCOL_VERSION, 1), mine)
        assert refused is not None and refused.code == "wrong_key", role
    assert guard.refusal(p.Hello("new", "generate", p.PROTOCOL_VERSION, 1), mine) is None
    for stranger in (routing_id("new", None), routing_id("new", b"k" * 32)):
        refused = guard.refusal(p.Hello("new", "generate", p.PROTOCOL_VERSION, 1), stranger)
        assert refused is not None and refused.code == "wrong_key"


def test_after_a_restart_a_key_for_another_role_binds_nothing() -> None:
    guard = Connections(make_core(), SECRET)  # "gen" is live, as generate
    as_train = routing_id("gen", worker_key(SECRET, "gen", "train"))
    refused = guard.refusal(p.Heartbeat("gen", None), as_train)
    assert refused is not None and refused.code == "wrong_sender"
