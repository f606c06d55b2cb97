"""Journal records: named where the core decides and applies, plain lists in the journal."""

from __future__ import annotations

from typing import NamedTuple

import msgpack
import pytest

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE
from asyncrl.runtime.scheduler.core import journal_records as r
from asyncrl.runtime.scheduler.core.transitions import CoreState


def test_every_record_goes_to_the_journal_and_back_unchanged() -> None:
    samples = [
        r.Registered("w", "logp"),
        r.Left("w"),
        r.Loaded("g", 3),
        r.Added(0, ["a", "b"], None),
        r.LeaseGranted(1, 2, "generate", "pending", "g", 10.0, [0, 1], 3, 6),
        r.Renewed([1], 20.0),
        r.Completed(1, [0], [[3, 3]], [b"x"]),
        r.Failed(1, [0], "boom", counted=False),
        r.Killed([0], "dead"),
        r.Published(4),
        r.Published(2, critic=True),
        r.Redone([3], "values", "critic version 1 is past the bound"),
        r.Granted("gpu", 1, 9),
        r.Waiting("gpu", 2),
        r.Unlocked("gpu", 9),
        r.Resumed(1),
        r.Lost(1, 0, "generate", "holder gone"),
        r.Durable(5),
        r.RolledBack(3, "trainer state lost"),
        r.RolledBack(1, "critic state lost", critic=True),
    ]
    assert {type(x) for x in samples} == set(r.OPS)
    for record in samples:
        entry = msgpack.unpackb(msgpack.packb(r.to_journal(record)))  # as replay reads it
        assert entry[0] == r.OPS[type(record)]
        back = r.from_journal(entry)
        assert type(back) is type(record)
        assert [list(v) if isinstance(v, tuple) else v for v in back] == [
            list(v) if isinstance(v, tuple) else v for v in record
        ]


def test_entries_written_before_a_field_was_added_still_read() -> None:
    """A FAIL from before ``counted`` existed: counted, as every failure was then."""
    assert r.from_journal([r.Op.FAIL, 5, [1, 2], "oom"]) == r.Failed(5, [1, 2], "oom", True)
    # A PUBLISH from before the critic: the policy's version.
    assert r.from_journal([r.Op.PUBLISH, 4]) == r.Published(4, critic=False)
    # A ROLL_BACK from before the critic rolled back: the trainer's.
    back = r.from_journal([r.Op.ROLL_BACK, 2, "lost"])
    assert back == r.RolledBack(2, "lost", critic=False)


def test_opcodes_never_move() -> None:
    """Journals on disk name records by these numbers."""
    assert [(op.name, op.value) for op in r.Op] == [
        ("REGISTER", 1), ("LOADED", 2), ("ADD", 3), ("LEASE", 4), ("RENEW", 5),
        ("COMPLETE", 6), ("FAIL", 7), ("KILL", 8), ("PUBLISH", 9), ("GRANT", 10),
        ("WAIT", 11), ("UNLOCK", 12), ("LEAVE", 13), ("RESUME", 14), ("LOSE", 15),
        ("DURABLE", 16), ("ROLL_BACK", 17), ("REDO", 18),
    ]  # fmt: skip


def test_fields_keep_their_journal_order() -> None:
    """Entries are positional on disk: a field moved or renamed here misreads old journals."""
    assert {r.OPS[kind].name: kind._fields for kind in r.OPS} == {
        "REGISTER": ("worker", "role"),
        "LEAVE": ("worker",),
        "LOADED": ("worker", "version"),
        "ADD": ("first_gid", "keys", "data"),
        "LEASE": ("lid", "fence", "role", "source", "worker", "expires_at", "gids", "version",
                  "train_by"),
        "RENEW": ("lids", "expires_at"),
        "COMPLETE": ("lid", "gids", "behaviour", "data", "filtered"),
        "FAIL": ("lid", "gids", "reason", "counted", "suspect"),
        "KILL": ("gids", "reason"),
        "PUBLISH": ("version", "critic"),
        "GRANT": ("resource", "lid", "token"),
        "WAIT": ("resource", "lid"),
        "UNLOCK": ("resource", "token"),
        "RESUME": ("epoch",),
        "LOSE": ("lid", "gid", "role", "reason", "counted"),
        "DURABLE": ("step",),
        "ROLL_BACK": ("step", "reason", "critic"),
        "REDO": ("gids", "role", "reason"),
    }  # fmt: skip


def test_a_named_record_is_never_read_as_a_journal_entry() -> None:
    """A record type the core cannot apply fails by name; its first field is no opcode."""

    class Unknown(NamedTuple):
        lid: int  # 1, which as an opcode would read as REGISTER

    state = CoreState(DEFAULT_PIPELINE, {})
    with pytest.raises(KeyError, match="Unknown"):
        state.apply(Unknown(1))
    state.apply([r.Op.REGISTER, "w", "logp"])  # a journal entry, as replay reads it
    state.apply((r.Op.LOADED, "w", 2))  # and as the core drains it
    assert (state.workers["w"].role, state.workers["w"].loaded) == ("logp", 2)
