"""The weight plane's control messages: round trips, garbage refused as WireError, tags,
and a request's seal (its MAC, checked before its fields are parsed)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.transport.weights.ucx.wire import (
    CONTROL_BYTES,
    HEADER_BYTES,
    REQUEST_TAG,
    RangeRequest,
    Status,
    TagSource,
    WireError,
    decode_header,
    decode_request,
    encode_header,
    encode_request,
)
from tests.support import hostile

U64 = st.integers(0, (1 << 64) - 1)


def sealed(fields: object, mac: bytes = b"") -> bytes:
    """A request's body: ``fields`` packed, and its MAC."""
    return msgpack.packb([msgpack.packb(fields), mac])


def framed(body: bytes, size: int) -> np.ndarray:
    """``body`` behind a 4-byte little-endian length, in a zeroed frame of ``size`` bytes."""
    out = np.zeros(size, np.uint8)
    raw = len(body).to_bytes(4, "little") + body
    out[: len(raw)] = np.frombuffer(raw, np.uint8)
    return out


@given(
    st.builds(
        RangeRequest,
        version=U64,
        start=U64,
        end=U64,
        reply_tag=U64,
        address=st.binary(min_size=1, max_size=1500),
        generation=U64,
        sequence=U64,
    ).filter(lambda r: r.start <= r.end)
)
def test_a_request_round_trips(request: RangeRequest) -> None:
    frame = encode_request(request)
    assert frame.dtype == np.uint8 and frame.size == CONTROL_BYTES
    assert decode_request(frame) == request


@given(st.sampled_from(Status), st.text(max_size=100))
def test_a_header_round_trips_with_its_detail_clipped(status: Status, detail: str) -> None:
    frame = encode_header(status, detail)
    assert frame.size == HEADER_BYTES
    got_status, got_detail = decode_header(frame)
    assert got_status is status
    clipped = detail.encode("utf-8", "replace")[:40]
    assert got_detail.encode() == clipped.decode("utf-8", "ignore").encode()


def test_a_short_detail_comes_back_whole() -> None:
    assert decode_header(encode_header(Status.GONE, "version 7 withdrawn")) == (
        Status.GONE,
        "version 7 withdrawn",
    )
    assert decode_header(encode_header(Status.OK)) == (Status.OK, "")


def test_an_oversize_request_is_refused_at_encode() -> None:
    big = RangeRequest(1, 0, 10, 2, b"x" * CONTROL_BYTES)
    with pytest.raises(WireError, match=f"exceeds {CONTROL_BYTES - 4}"):
        encode_request(big)
    # the largest address that fits still round-trips
    overhead = len(sealed([1, 0, 10, 2, b"", 0, 0])) + 4  # bin8 -> bin16 lengths, twice
    fits = RangeRequest(1, 0, 10, 2, b"x" * (CONTROL_BYTES - 4 - overhead))
    assert decode_request(encode_request(fits)) == fits


def test_a_seal_covers_the_packed_fields_and_is_checked_before_they_are_parsed() -> None:
    request = RangeRequest(3, 0, 10, 2, b"addr", 1, 9)
    seen: list[tuple[bytes, bytes]] = []
    frame = encode_request(request, lambda fields: b"mac of " + fields[:4])
    assert decode_request(frame, lambda fields, mac: seen.append((fields, mac))) == request
    [(fields, mac)] = seen
    assert msgpack.unpackb(fields) == [3, 0, 10, 2, b"addr", 1, 9]
    assert mac == b"mac of " + fields[:4]

    class Refused(Exception):
        pass

    def refuse(fields: bytes, mac: bytes) -> None:
        raise Refused

    garbage_fields = framed(msgpack.packb([b"\xc1", b"mac"]), CONTROL_BYTES)
    for frame in (encode_request(request), garbage_fields):
        with pytest.raises(Refused):
            decode_request(frame, refuse)


# --- garbage in, WireError out -------------------------------------------------------------


def decodes_or_wire_error(decode: Callable[[np.ndarray], object], frame: np.ndarray) -> None:
    with contextlib.suppress(WireError):
        decode(frame)


@given(st.binary(max_size=CONTROL_BYTES + 8))
def test_unframed_garbage_only_ever_raises_wire_error(raw: bytes) -> None:
    frame = np.frombuffer(raw, np.uint8)
    decodes_or_wire_error(decode_request, frame)
    decodes_or_wire_error(decode_header, frame)


@given(st.binary(max_size=200), st.sampled_from([HEADER_BYTES, 256, CONTROL_BYTES]))
def test_framed_garbage_only_ever_raises_wire_error(body: bytes, size: int) -> None:
    if len(body) + 4 > size:
        body = body[: size - 4]
    decodes_or_wire_error(decode_request, framed(body, size))
    decodes_or_wire_error(decode_header, framed(body, size))


MSGPACK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@given(MSGPACK)
def test_well_formed_msgpack_of_the_wrong_shape_only_ever_raises_wire_error(body) -> None:  # type: ignore[no-untyped-def]
    packed = msgpack.packb(body)
    decodes_or_wire_error(decode_request, framed(packed, max(CONTROL_BYTES, len(packed) + 4)))
    inner = sealed(body)  # the same shapes as a sealed request's fields
    decodes_or_wire_error(decode_request, framed(inner, max(CONTROL_BYTES, len(inner) + 4)))
    decodes_or_wire_error(decode_header, framed(packed, max(HEADER_BYTES, len(packed) + 4)))


@given(
    st.lists(
        st.one_of(st.integers(-5, 5), st.booleans(), st.none(), st.binary(max_size=3)),
        min_size=7,
        max_size=7,
    )
)
def test_a_request_with_bad_fields_only_ever_raises_wire_error(body: list) -> None:
    decodes_or_wire_error(decode_request, framed(sealed(body), CONTROL_BYTES))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([0, 0, 0, 0, 5, 0, 0], "address must be non-empty bytes"),
        ([0, 0, 0, 0, None, 0, 0], "address must be non-empty bytes"),
        ([0, 0, 0, 0, b"", 0, 0], "address must be non-empty bytes"),
        ([0, 0, 0, 0, "addr", 0, 0], "address must be non-empty bytes"),
        ([0, 9, 3, 0, b"a", 0, 0], r"range \[9, 3\) runs backwards"),
        ([-1, 0, 0, 0, b"a", 0, 0], "non-negative integers"),
        ([True, 0, 0, 0, b"a", 0, 0], "non-negative integers"),
        ([0, 0.0, 0, 0, b"a", 0, 0], "non-negative integers"),
        ([0, 0, 0, 0, b"a", -1, 0], "non-negative integers"),
        ([0, 0, 0, 0, b"a", 0, -1], "non-negative integers"),
        (
            [0, 0, 0, 0, b"a", 0],
            r"request must be \[version, start, end, reply_tag, address, generation, sequence\]",
        ),
        ({"version": 0}, "request must be"),
    ],
)
def test_a_malformed_request_says_what_is_wrong(body: object, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_request(framed(sealed(body), CONTROL_BYTES))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([0, 0, 0, 0, b"a", 0, 0], r"request must be \[fields, mac\]"),  # an unsealed one
        ([b"fields"], r"request must be \[fields, mac\]"),
        ([b"fields", None], r"request must be \[fields, mac\]"),
        ([b"\xc1", b""], "request fields not MessagePack"),
    ],
)
def test_a_malformed_seal_says_what_is_wrong(body: object, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_request(framed(msgpack.packb(body), CONTROL_BYTES))


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (np.zeros(0, np.uint8), "exceeds"),
        (np.zeros(3, np.uint8), "exceeds"),
        (framed(b"", HEADER_BYTES), "not MessagePack"),
        (framed(b"\xc1", HEADER_BYTES), "not MessagePack"),  # a byte msgpack never uses
        (framed(msgpack.packb([0, 1]) + b"\x00", HEADER_BYTES), "not MessagePack"),
        (framed(msgpack.packb([7, ""]), HEADER_BYTES), "header must be"),
        (framed(msgpack.packb([0]), HEADER_BYTES), "header must be"),
        (framed(msgpack.packb(None), HEADER_BYTES), "header must be"),
    ],
)
def test_a_malformed_header_says_what_is_wrong(frame: np.ndarray, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_header(frame)


def test_a_length_past_the_frame_is_refused() -> None:
    frame = framed(b"", HEADER_BYTES)
    frame[:4] = np.frombuffer((HEADER_BYTES - 3).to_bytes(4, "little"), np.uint8)
    with pytest.raises(WireError, match=f"length {HEADER_BYTES - 3} exceeds"):
        decode_header(frame)


# --- reply tags ------------------------------------------------------------------------------


def test_tags_are_unique_and_their_pairs_never_collide() -> None:
    sources = [TagSource() for _ in range(4)]
    seen: set[int] = set()
    for source in sources:
        for _ in range(5000):
            tag = source.take()
            assert tag != REQUEST_TAG and tag + 1 != REQUEST_TAG
            assert tag > 0 and tag + 1 < 1 << 64  # UCX tags are 64-bit
            assert tag % 2 == 0  # t is the header, t + 1 the data: the pair is disjoint
            assert tag not in seen and tag + 1 not in seen
            seen.update((tag, tag + 1))


def test_a_tag_source_wraps_only_after_two_to_the_thirty_takes() -> None:
    source = TagSource()
    first = source.take()
    source._next = (1 << 30) - 1  # jump to the last counter value
    last = source.take()
    assert last != first and last >> 32 == first >> 32
    assert source.take() == first  # then it wraps around to the first tag


# --- every field hostile ---------------------------------------------------------------------

# version, start, end, reply_tag, address, generation, sequence
REQUEST = [1, 0, 10, 2, b"addr", 0, 1]
SEAL = [msgpack.packb(REQUEST), b""]  # fields, mac
HEADER = [0, "detail"]  # status, detail


def test_every_hostile_value_in_every_field_is_taken_or_a_wire_error() -> None:
    """Wrong types, invalid UTF-8, 64-bit edges, non-finite floats, nesting a thousand deep
    (once a RecursionError from the error's own repr) and ten thousand deep, extensions."""
    for body, size, decode in (
        (SEAL, CONTROL_BYTES, decode_request),
        (HEADER, HEADER_BYTES, decode_header),
    ):
        for index in range(len(body)):
            for raw in hostile.HOSTILE:
                packed = hostile.packed(body, (index,), raw)
                decodes_or_wire_error(decode, framed(packed, max(size, len(packed) + 4)))
    for index in range(len(REQUEST)):  # inside the seal
        for raw in hostile.HOSTILE:
            packed = msgpack.packb([hostile.packed(REQUEST, (index,), raw), b""])
            decodes_or_wire_error(
                decode_request, framed(packed, max(CONTROL_BYTES, len(packed) + 4))
            )
