"""The flat weight layout: plan, stage and views round-trip; the manifest checks what it gets."""

from __future__ import annotations

import contextlib

import crc32c
import msgpack
import numpy as np
import pytest
import torch

from asyncrl.transport import protocol as p
from asyncrl.transport.weights.layout import (
    ALIGN,
    Manifest,
    ManifestError,
    Stager,
    TensorSpec,
    bucket_checksums,
    plan,
    stage,
    views,
)
from tests.support import hostile


def mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(7, 3, generator=g),
        "norm.bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "head.fp16": torch.randn(3, 1, 2, generator=g).to(torch.float16),
        "step": torch.tensor(12345678901, dtype=torch.int64),  # a scalar
        "positions": torch.arange(11, dtype=torch.int64),
        "mask": torch.rand(13, generator=g) > 0.5,
        "empty": torch.zeros(0, 4),
        "one.bool": torch.tensor(True),
        "odd": torch.randn(1, 1, 1, 3, generator=g),
        "after.empty": torch.randn(2, generator=g).to(torch.bfloat16),
    }


def as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def staged(
    state: dict[str, torch.Tensor], bucket_bytes: int = 64, threads: int = 2
) -> tuple[tuple[TensorSpec, ...], int, np.ndarray, list[int]]:
    specs, total = plan(state)
    buffer = np.full(total, 0xAB, np.uint8)  # not zero, so a missed copy shows
    checksums = stage(state, specs, buffer, bucket_bytes, total, threads=threads)
    return specs, total, buffer, checksums


def manifest_for(state: dict[str, torch.Tensor], bucket_bytes: int = 64) -> Manifest:
    specs, total, _, checksums = staged(state, bucket_bytes)
    return Manifest(9, specs, total, bucket_bytes, tuple(checksums))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("bucket_bytes", [1, 64, 100, 1 << 20])
def test_staging_checksums_equal_the_checksums_of_the_staged_buffer(
    bucket_bytes: int, threads: int
) -> None:
    _, total, buffer, checksums = staged(mixed_state(), bucket_bytes, threads)
    assert checksums == list(bucket_checksums(buffer, total, bucket_bytes))


@pytest.mark.parametrize("threads", [1, 2])
def test_tensors_larger_than_a_copy_piece_stage_whole_across_buckets(threads: int) -> None:
    g = torch.Generator().manual_seed(1)
    state = {"small": torch.randn(3, generator=g), "big": torch.randn(9 << 18, generator=g)}
    specs, total, buffer, checksums = staged(state, bucket_bytes=5 << 20, threads=threads)
    assert checksums == list(bucket_checksums(buffer, total, 5 << 20))
    assert as_bytes(views(buffer, specs)["big"]) == as_bytes(state["big"])


def test_one_stager_stages_version_after_version() -> None:
    stager = Stager(threads=3)
    for version in range(4):
        state = {name: t + version for name, t in mixed_state().items() if t.is_floating_point()}
        specs, total = plan(state)
        buffer = np.full(total, 0xAB, np.uint8)
        checksums = stager.stage(state, specs, buffer, 16, total)
        assert checksums == list(bucket_checksums(buffer, total, 16))
        assert all(as_bytes(t) == as_bytes(state[n]) for n, t in views(buffer, specs).items())
    stager.close()


def test_a_copy_that_fails_on_a_helper_fails_the_staging_and_the_stager_goes_on() -> None:
    state = {"first": torch.randn(16), "second": torch.randn(16)}
    specs, total = plan(state)
    stager = Stager(threads=2)
    # Two buckets: the caller copies the first, the helper the second, which does not fit.
    with pytest.raises(ValueError):
        stager.stage(state, specs, np.zeros(ALIGN, np.uint8), ALIGN, total)
    buffer = np.zeros(total, np.uint8)
    assert stager.stage(state, specs, buffer, ALIGN, total) == list(
        bucket_checksums(buffer, total, ALIGN)
    )
    stager.close()


# --- plan, stage, views ------------------------------------------------------------------


def test_views_give_back_every_tensor_byte_exact() -> None:
    state = mixed_state()
    specs, _, buffer, _ = staged(state)
    got = views(buffer, specs)
    assert list(got) == list(state)
    for name, tensor in state.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert as_bytes(got[name]) == as_bytes(tensor), name


def test_views_of_a_copied_buffer_are_views_not_copies() -> None:
    state = {"w": torch.ones(4), "b": torch.zeros(3, dtype=torch.int64)}
    specs, _, buffer, _ = staged(state)
    received = buffer.copy()  # what a receiver holds after a transfer
    got = views(received, specs)
    received[specs[0].offset : specs[0].offset + 4] = np.frombuffer(
        np.float32(2.5).tobytes(), np.uint8
    )
    assert got["w"][0].item() == 2.5


def test_plan_aligns_every_offset_and_keeps_tensors_apart() -> None:
    state = mixed_state()
    specs, total = plan(state)
    assert [s.name for s in specs] == list(state)
    end = 0
    for spec in specs:
        tensor = state[spec.name]
        assert spec.offset % ALIGN == 0, spec
        assert spec.offset >= end, spec  # no overlap with the one before
        assert spec.nbytes == tensor.numel() * tensor.element_size()
        assert spec.shape == tuple(tensor.shape)
        end = spec.offset + spec.nbytes
    assert end <= total and total % ALIGN == 0


def test_stage_copies_non_contiguous_tensors_by_value() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"t": base.t(), "every_other": base[:, ::2]}
    specs, _, buffer, _ = staged(state)
    got = views(buffer, specs)
    assert torch.equal(got["t"], base.t())
    assert torch.equal(got["every_other"], base[:, ::2])


def test_an_empty_state_plans_an_empty_buffer() -> None:
    specs, total = plan({})
    assert specs == () and total == 0
    assert list(bucket_checksums(np.zeros(0, np.uint8), 0, 64)) == []
    assert Manifest(0, (), 0, 64, ()).buckets == 0


def test_a_dtype_weights_cannot_carry_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="'z'"):
        plan({"z": torch.zeros(2, dtype=torch.complex64)})


# --- bucket checksums ----------------------------------------------------------------------


@pytest.mark.parametrize("bucket_bytes", [1, 7, 64, 100, 4096])
def test_bucket_checksums_are_the_crc32c_of_each_slice(bucket_bytes: int) -> None:
    _, total, buffer, _ = staged(mixed_state())
    raw = buffer.tobytes()
    expected = [
        crc32c.crc32c(raw[start : start + bucket_bytes]) for start in range(0, total, bucket_bytes)
    ]
    assert list(bucket_checksums(buffer, total, bucket_bytes)) == expected
    manifest = Manifest(1, (), total, bucket_bytes, tuple(expected))
    manifest.check()
    assert b"".join(raw[slice(*manifest.bucket_range(i))] for i in range(manifest.buckets)) == raw


def test_bucket_checksums_cover_only_the_first_total_bytes() -> None:
    buffer = np.arange(200, dtype=np.uint8)  # a reused slot, longer than this version
    got = list(bucket_checksums(buffer, 130, 64))
    raw = buffer.tobytes()
    assert got == [
        crc32c.crc32c(raw[0:64]),
        crc32c.crc32c(raw[64:128]),
        crc32c.crc32c(raw[128:130]),
    ]


def test_a_flipped_bit_changes_its_bucket_only() -> None:
    _, total, buffer, _ = staged(mixed_state())
    before = list(bucket_checksums(buffer, total, 64))
    buffer[70] ^= 1
    after = list(bucket_checksums(buffer, total, 64))
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [1]


# --- the manifest on the wire ----------------------------------------------------------------


def test_a_manifest_round_trips_through_msgpack() -> None:
    manifest = manifest_for(mixed_state())
    wire = msgpack.unpackb(msgpack.packb(manifest.to_payload()))
    assert Manifest.from_payload(wire) == manifest


def test_a_received_buffer_checks_against_the_manifest_and_views_back() -> None:
    state = mixed_state()
    manifest = manifest_for(state, bucket_bytes=100)
    _, _, buffer, _ = staged(state)
    received = Manifest.from_payload(msgpack.unpackb(msgpack.packb(manifest.to_payload())))
    assert tuple(bucket_checksums(buffer, received.total, received.bucket_bytes)) == (
        received.checksums
    )
    for name, tensor in views(buffer, received.tensors).items():
        assert as_bytes(tensor) == as_bytes(state[name])


def payload(**changes: object) -> dict[str, object]:
    good = manifest_for({"w": torch.ones(5), "b": torch.zeros(2, dtype=torch.int64)})
    out = msgpack.unpackb(msgpack.packb(good.to_payload()))
    out.update(changes)
    return out


def tensor_row(name: str = "w", dtype: str = "float32", shape=(5,), offset=0, nbytes=20):
    return [name, dtype, list(shape), offset, nbytes]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([1, 2, 3], "must be a map, got list"),
        (None, "must be a map, got NoneType"),
        (b"manifest", "must be a map, got bytes"),
    ],
)
def test_from_payload_refuses_what_is_not_a_map(bad: object, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        Manifest.from_payload(bad)


@pytest.mark.parametrize("field", ["version", "total", "bucket_bytes", "checksums", "tensors"])
def test_from_payload_names_a_missing_field(field: str) -> None:
    bad = payload()
    del bad[field]
    with pytest.raises(ManifestError, match=f"missing or malformed.*{field}"):
        Manifest.from_payload(bad)


@pytest.mark.parametrize(
    "changes",
    [
        {"version": "3"},
        {"version": 1.5},
        {"version": float("inf")},
        {"total": True},
        {"checksums": 5},
        {"checksums": [None, 0]},
        {"tensors": [["w", "float32", [5], 0]]},  # four fields, not five
        {"tensors": [["w", "float32", 5, 0, 20]]},  # a shape that is not a list
        {"tensors": [tensor_row(shape=(2**70,), nbytes=0)]},  # beyond int64 still an int
        {"tensors": [tensor_row(offset=0.0)]},
        {"tensors": 7},
    ],
)
def test_from_payload_refuses_malformed_fields(changes: dict[str, object]) -> None:
    with pytest.raises(ManifestError):
        Manifest.from_payload(payload(**changes))


def test_from_payload_refuses_the_wrong_number_of_checksums() -> None:
    with pytest.raises(ManifestError, match="3 checksums for 2 buckets of 128 bytes"):
        Manifest.from_payload(payload(checksums=[1, 2, 3], total=128, bucket_bytes=64))
    with pytest.raises(ManifestError, match="1 checksums for 2 buckets"):
        Manifest.from_payload(payload(checksums=[1], total=65, bucket_bytes=64))


def test_from_payload_refuses_nonsense_sizes() -> None:
    for changes in ({"version": -1}, {"total": -64}, {"bucket_bytes": 0}):
        with pytest.raises(ManifestError, match=r"version .* total .* bucket_bytes"):
            Manifest.from_payload(payload(**changes))


def test_from_payload_refuses_an_unknown_dtype_by_tensor_name() -> None:
    with pytest.raises(ManifestError, match="tensor 'w': unknown dtype 'float8'"):
        Manifest.from_payload(payload(tensors=[tensor_row(dtype="float8")]))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (tensor_row(offset=128), r"bytes \[128, 148\) out of bounds of the 128-byte buffer"),
        (tensor_row(offset=-64), r"bytes \[-64, -44\) out of bounds"),
        (tensor_row(shape=(40,), nbytes=160), r"bytes \[0, 160\) out of bounds"),
        (tensor_row(offset=8), "offset 8 is not 64-byte aligned"),
        (tensor_row(offset=65), "offset 65 is not 64-byte aligned"),
        (tensor_row(nbytes=16), r"16 bytes, but shape \(5,\) of float32 is 20"),
        (tensor_row(dtype="bfloat16"), r"20 bytes, but shape \(5,\) of bfloat16 is 10"),
        (tensor_row(shape=(-2, -2), nbytes=16), "negative dimension"),
        # the int64 product of this shape wraps to 0
        (tensor_row(shape=(2**32, 2**32), nbytes=0), r"0 bytes, but shape .* is \d{20}"),
    ],
)
def test_from_payload_refuses_a_tensor_that_does_not_fit(row: list, message: str) -> None:
    bad = payload(tensors=[row], total=128, bucket_bytes=64, checksums=[0, 0])
    with pytest.raises(ManifestError, match=f"tensor 'w': {message}"):
        Manifest.from_payload(bad)


def test_from_payload_accepts_empty_and_scalar_tensors_at_the_end() -> None:
    rows = [
        tensor_row(name="s", shape=(), nbytes=4, offset=0),
        tensor_row(name="e", shape=(0, 3), nbytes=0, offset=64),  # empty, at the very end
    ]
    manifest = Manifest.from_payload(payload(tensors=rows, total=64, checksums=[0]))
    got = views(np.zeros(64, np.uint8), manifest.tensors)
    assert got["s"].shape == () and got["e"].shape == (0, 3)


def test_a_manifest_for_another_version_than_planned_is_refused() -> None:
    payload = manifest_for(mixed_state()).to_payload()
    assert Manifest.from_payload(payload, version=9).version == 9
    with pytest.raises(ManifestError, match="plan for version 10 carries manifest 9"):
        Manifest.from_payload(payload, version=10)


def test_every_hostile_value_in_a_plans_manifest_is_a_protocol_or_manifest_error() -> None:
    """The manifest as a generator gets it: in a WeightsPlan from the scheduler, decoded,
    then parsed."""
    good = payload()
    rows = [("tensors", 0, i) for i in range(5)]
    paths = [(key,) for key in good] + [("checksums", 0), ("tensors", 0), *rows]
    known = {"manifest": good, "version": good["version"]}
    for path in [*paths, ("tensors", 0, 2, 0)]:
        for raw in hostile.HOSTILE:
            for arrays in ((), (hostile.ARRAY_FRAME,)):
                frames = hostile.frames(p.WeightsPlan, (1, *path), raw, known=known, arrays=arrays)
                try:
                    plan = p.decode(frames)
                except p.ProtocolError:
                    continue
                with contextlib.suppress(ManifestError):
                    Manifest.from_payload(plan.manifest, version=plan.version)
