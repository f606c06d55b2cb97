"""The wire protocol: round trips, zero-copy arrays, and a clear error for every bad frame."""

from __future__ import annotations

import contextlib
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import Struct, structs

from asyncrl.transport import protocol as p
from tests.support import hostile

REF = p.PayloadRef("generate-0", "tcp://10.0.0.2:4000", "9f3a", 7, 1 << 20, 0xDEADBEEF)


def round_trip(message: p.Message, req_id: int = 7) -> p.Message:
    frames = p.encode(message, req_id)
    assert p.request_id(frames) == req_id
    return p.decode([bytes(f) for f in frames])


def test_every_kind_is_declared_once() -> None:
    kinds = [cls.KIND for cls in p._MESSAGES]
    assert len(kinds) == len(set(kinds)) == len(p.Kind)


@pytest.mark.parametrize(
    "message",
    [
        p.Hello("generate-0", "generate", p.PROTOCOL_VERSION, 123),
        p.Claim("w", "logp", 4),
        p.Heartbeat("w"),
        p.Heartbeat("w", (3, 4)),
        p.Heartbeat("w", ()),
        p.Fail("w", 3, 9, None, "boom"),
        p.Fail("w", 3, 9, (1, 2), "boom"),
        p.Lease(1, 2, "train", 59.5, None, (p.Item(0, "q0", {"dataloader": {"x": 0}}),)),
        p.AddGroups("d", (p.NewGroup("q1", {"x": 1}),)),
        p.StatusReply({"groups": {"pending": 3}, "nested": [1, 2.5, None, "s"]}),
        p.Event(4, "transition.pending.generating", {"groups": [1, 2]}),
        p.Ready("w", "demo", 1, 2.0, 60.0, 1 << 20, 0),
        p.PublishVersion("t", 3),
        p.PublishVersion("t", 3, {"buckets": [[0, 64]], "sum": "ab"}, b"\x00ucx\xff"),
        p.WantWeights("g", 0),
        p.WantWeights("g", 3, b"\x01addr", "relay-1"),
        p.WeightsPlan(3, {"buckets": [[0, 64]]}, "t", b"\x00ucx\xff"),
        p.Complete("g", 1, 2, (p.Result(3, {}, (0, 1), REF),)),
        p.Complete("g", 1, 2, (p.Result(3, {}, (0, 1), REF),), claim_next=4),
        p.LoadedVersion("g", 3, claim_next=2),
        p.Lease(1, 2, "logp", 9.0, None, (p.Item(3, "q3", {"dataloader": {}}, {"generate": REF}),)),
        p.Fail("w", 3, 9, None, "fetch", (p.LostPayload(3, "generate", "gone"),)),
        p.Held("g", "s1", (1, 2, 3), 4096),
        p.Drop((2,)),
    ],
)
def test_messages_round_trip(message: p.Message) -> None:
    assert round_trip(message) == message


def test_requests_from_before_the_weight_plane_still_decode() -> None:
    """A PublishVersion without weights fields (an older sender) takes the defaults."""
    assert p.decode([header(p.Kind.PUBLISH_VERSION, ["t", 2])]) == p.PublishVersion("t", 2)
    assert p.decode([header(p.Kind.WANT_WEIGHTS, ["g", 2])]) == p.WantWeights("g", 2, b"", "")


def test_a_complete_from_before_claim_next_claims_nothing() -> None:
    """An older worker's Complete ends at durable_step: it asks for no next lease."""
    old = p.decode([header(p.Kind.COMPLETE, ["g", 1, 2, [], None, None])])
    assert old == p.Complete("g", 1, 2, ()) and old.claim_next == 0


def test_a_loaded_version_from_before_claim_next_claims_nothing() -> None:
    old = p.decode([header(p.Kind.LOADED_VERSION, ["g", 3])])
    assert old == p.LoadedVersion("g", 3) and old.claim_next == 0


def test_arrays_travel_as_their_own_frames_and_come_back_as_views() -> None:
    tokens = np.arange(1000, dtype=np.int32)
    logprobs = np.linspace(-1, 0, 12, dtype=np.float32).reshape(3, 4)
    message = p.Complete(
        "w", 1, 2, (p.Result(5, {"tokens": tokens, "lp": [logprobs]}, (0, 1)),), {"loss": 0.1}
    )
    frames = p.encode(message)
    assert len(frames) == 3
    assert len(frames[0]) < 200  # the header holds no array bytes
    assert bytes(frames[1]) == tokens.tobytes()
    decoded = p.decode(frames)
    assert isinstance(decoded, p.Complete)
    got = decoded.results[0].data
    np.testing.assert_array_equal(got["tokens"], tokens)
    np.testing.assert_array_equal(got["lp"][0], logprobs)
    assert got["tokens"].base is not None  # a view on the frame, not a copy


def test_payload_blobs_keep_arrays() -> None:
    payload = {"t": np.arange(6, dtype=np.int64).reshape(2, 3), "r": 1.5, "s": ["a"]}
    back = p.unpack_payload(p.pack_payload(payload))
    np.testing.assert_array_equal(back["t"], payload["t"])
    assert back["r"] == 1.5 and back["s"] == ["a"]


def test_objects_that_are_not_data_are_refused_at_the_sender() -> None:
    with pytest.raises(TypeError, match="object"):
        p.encode(p.Complete("w", 1, 2, (p.Result(0, {"x": np.array([object()])}),)))
    with pytest.raises(TypeError, match="Path"):
        p.encode(p.StatusReply({"x": Path("/etc")}))


REF_BAD = ["g", "tcp://h:1", "s", 1, 2, "not a checksum"]


def header(kind: int, body: list, version: int = p.PROTOCOL_VERSION, req_id: int = 3) -> bytes:
    return msgpack.packb([version, kind, req_id, body])


@pytest.mark.parametrize(
    ("frames", "words"),
    [
        ([], "empty"),
        ([b"\xc1"], "not MessagePack"),
        ([msgpack.packb({"a": 1})], "header must be"),
        ([header(p.Kind.STATUS, [], version=99)], "protocol version 99"),
        ([header(999, [])], "unknown message kind 999"),
        (
            [header(p.Kind.CLAIM, ["w", "logp"])],
            "Claim: expected array of at least length 3, got 2",
        ),
        ([header(p.Kind.CLAIM, ["w", "logp", "4"])], "Claim.n: expected int"),
        ([header(p.Kind.CLAIM, ["w", "logp", True])], "Claim.n: expected int, got bool"),
        ([header(p.Kind.LEASE, [1, 2, "t", float("nan"), None, []])], "not a finite number"),
        ([header(p.Kind.FAIL, ["w", 1, 2, [1, "x"], "r"])], "Fail.gids[1]"),
        (
            [header(p.Kind.LEASE, [1, 2, "t", 1.0, None, [[1, "k", {}, {"g": [1]}]]])],
            "Lease.items[0].refs[...]: expected array of at least length 6",
        ),
        (
            [header(p.Kind.LEASE, [1, 2, "t", 1.0, None, [[1, "k", {}, {"g": REF_BAD}]]])],
            "Lease.items[0].refs[...].checksum: expected int, got str",
        ),
        ([header(p.Kind.STATUS_REPLY, [{1: 2}])], "StatusReply.summary: map key"),
        ([header(p.Kind.CLAIM, ["w", "logp", 4, "extra"])], "Claim: expected array of at most"),
        ([header(p.Kind.STATUS, []), b"extra"], "never used"),
        ([header(p.Kind.WANT_WEIGHTS, ["g", 1, "addr"])], "WantWeights.address: expected bytes"),
        ([header(p.Kind.PUBLISH_VERSION, ["t", 1, [1], b""])], "PublishVersion.weights"),
    ],
)
def test_bad_frames_are_errors_that_say_what_is_wrong(frames: list, words: str) -> None:
    with pytest.raises(p.ProtocolError, match=words.replace("[", r"\[")):
        p.decode(frames)


def array_ref(index: int, dtype: str, shape: list) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb([index, dtype, shape]))


@pytest.mark.parametrize(
    ("ref", "frame", "words"),
    [
        (array_ref(2, "int32", [1]), b"\0" * 4, "missing"),
        (array_ref(1, "object", [1]), b"\0" * 8, "not allowed"),
        (array_ref(1, "int32", [3]), b"\0" * 8, "needs 12"),  # truncated array
        (array_ref(1, "int32", [-1]), b"", "shape"),
        (msgpack.ExtType(9, b""), b"", "extension 9"),
    ],
)
def test_bad_array_references_are_errors(ref: msgpack.ExtType, frame: bytes, words: str) -> None:
    body = [{"x": ref}]
    with pytest.raises(p.ProtocolError, match=words) as caught:
        p.decode([msgpack.packb([p.PROTOCOL_VERSION, p.Kind.STATUS_REPLY, 5, body]), frame])
    assert caught.value.req_id == 5


def test_the_request_id_survives_a_bad_body_for_the_error_reply() -> None:
    with pytest.raises(p.ProtocolError) as caught:
        p.decode([header(p.Kind.CLAIM, ["w"], req_id=42)])
    assert caught.value.req_id == 42


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_arbitrary_bytes_decode_or_raise_protocol_error(frames: list[bytes]) -> None:
    with contextlib.suppress(p.ProtocolError):
        p.decode(frames)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(
    kind=st.sampled_from([int(k) for k in p.Kind]) | st.integers(-(2**63), 2**63 - 1),
    body=st.lists(msgpack_values, max_size=8),
)
def test_well_formed_headers_with_wrong_fields_raise_protocol_error(kind: int, body: list) -> None:
    with contextlib.suppress(p.ProtocolError):
        p.decode([msgpack.packb([p.PROTOCOL_VERSION, kind, 1, body])])


def wire_values(hint: Any) -> st.SearchStrategy[Any]:
    """Mostly values of the right shape for ``hint``, sometimes anything at all."""
    right = _right_shape(hint)
    return st.integers(0, 9).flatmap(lambda i: msgpack_values if i == 0 else right)


def _right_shape(hint: Any) -> st.SearchStrategy[Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return st.none() | wire_values(next(a for a in args if a is not type(None)))
    if hint is int:
        return st.integers(-(2**63), 2**64 - 1)
    if hint is float:
        special = st.sampled_from([math.nan, math.inf, -math.inf, -0.0])
        return special | st.floats() | st.integers(-(2**63), 2**64 - 1)
    if hint in (str, bool, bytes):
        return {str: st.text(max_size=5), bool: st.booleans(), bytes: st.binary(max_size=5)}[hint]
    if isinstance(hint, type) and issubclass(hint, Struct):
        return bodies(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(wire_values(args[0]), max_size=3)
    if origin is tuple:
        return st.tuples(*(wire_values(a) for a in args)).map(list)
    if origin is dict and args[1] is Any:
        return st.dictionaries(st.text(max_size=3), msgpack_values, max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=3), wire_values(args[1]), max_size=3)
    raise TypeError(hint)


@functools.cache
def bodies(cls: type) -> st.SearchStrategy[list[Any]]:
    """Bodies for ``cls``: mostly every field of the right shape, some cut short or too long."""
    hints = typing.get_type_hints(cls)
    full = st.tuples(*(wire_values(hints[f.name]) for f in structs.fields(cls))).map(list)
    cut = full.flatmap(lambda body: st.integers(0, len(body)).map(lambda n: body[:n]))
    return st.integers(0, 4).flatmap(
        lambda i: cut if i == 0 else full.map(lambda b: [*b, 0]) if i == 1 else full
    )


@settings(max_examples=1000, deadline=None)
@given(data=st.data())
def test_bodies_of_nearly_the_right_shape_decode_to_what_encodes_back(data: st.DataObject) -> None:
    """Every kind, with bodies close to valid: an error naming the message, or a message
    that survives a second round trip unchanged (what is taken, a sender could build)."""
    cls = data.draw(st.sampled_from(p._MESSAGES))
    body = data.draw(bodies(cls))
    try:
        message = p.decode([msgpack.packb([p.PROTOCOL_VERSION, int(cls.KIND), 1, body])])
    except p.ProtocolError as error:
        assert str(error).startswith(cls.__name__), str(error)
        return
    assert type(message) is cls
    assert repr(round_trip(message)) == repr(message)


# --- every field of every message, hostile ------------------------------------------------


def test_a_worker_name_that_is_not_utf8_is_a_protocol_error_naming_the_field() -> None:
    """A Hello whose worker name holds the byte 0xb4: once a UnicodeDecodeError, which
    ended the scheduler."""
    body = b"\x94" + hostile.BAD_UTF8 + msgpack.packb("generate") + b"\x02\x01"
    frame = bytes([0x94, p.PROTOCOL_VERSION, p.Kind.HELLO, 7]) + body  # all fixints
    with pytest.raises(p.ProtocolError) as caught:
        p.decode_with_id([frame])
    assert str(caught.value) == "Hello.worker: invalid UTF-8"
    assert caught.value.req_id == 7


def decodes_or_says_what(cls: type, frames: list[bytes]) -> None:
    """A ``cls`` that encodes again, or a ProtocolError naming the message (or, when the
    bytes do not even delimit a body, the header); nothing else."""
    try:
        message = p.decode(frames)
    except p.ProtocolError as error:
        assert str(error).startswith((cls.__name__, "header ")), str(error)
        return
    assert type(message) is cls
    p.encode(message)  # what is taken, a sender could build


@pytest.mark.parametrize("cls", hostile.MESSAGES, ids=lambda cls: cls.__name__)
def test_every_hostile_value_in_every_field_is_taken_or_a_protocol_error(cls: type) -> None:
    for path, name, _ in hostile.fields(cls):
        for raw in hostile.HOSTILE:
            for arrays in ((), (hostile.ARRAY_FRAME,)):
                try:
                    decodes_or_says_what(cls, hostile.frames(cls, path, raw, arrays=arrays))
                except Exception as error:
                    raise AssertionError(f"{name} = {raw[:40]!r}, {len(arrays)} arrays") from error


@pytest.mark.parametrize("cls", hostile.MESSAGES, ids=lambda cls: cls.__name__)
def test_a_str_that_is_not_utf8_is_named_by_its_field(cls: type) -> None:
    for path, name, hint in hostile.fields(cls):
        if hostile.takes_text(hint):
            with pytest.raises(p.ProtocolError) as caught:
                p.decode(hostile.frames(cls, path, hostile.BAD_UTF8))
            assert str(caught.value) == f"{name}: invalid UTF-8"


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_drawn_hostile_values_in_any_field_are_taken_or_a_protocol_error(
    data: st.DataObject,
) -> None:
    cls = data.draw(st.sampled_from([cls for cls in hostile.MESSAGES if structs.fields(cls)]))
    path, _, _ = data.draw(st.sampled_from(list(hostile.fields(cls))))
    raw = data.draw(hostile.hostile_bytes())
    arrays = data.draw(st.lists(st.binary(max_size=12), max_size=3))
    decodes_or_says_what(cls, hostile.frames(cls, path, raw, arrays=tuple(arrays)))
