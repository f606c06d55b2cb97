"""A version in parts (transport/weights/parts.py): rank 0's announcement of every rank's
part, one plan per part for a receiver, and the parts laid into whole tensors, whatever
the group's size and however unevenly its rows fall."""

from __future__ import annotations

import pytest
import torch

from asyncrl.transport.messages import WeightsPlan
from asyncrl.transport.weights.base import Announcement
from asyncrl.transport.weights.layout import Manifest, ManifestError, plan
from asyncrl.transport.weights.parts import (
    assemble,
    compose,
    has_parts,
    part_count,
    part_plans,
    parts_for,
    rows_from,
    served_from,
    spans_of_parts,
    split_dims,
)

WHOLE = {
    "embed.weight": torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3),
    "norm.weight": torch.arange(5, dtype=torch.bfloat16),
    "bias": torch.arange(2, dtype=torch.float32),
}


def _shards(ranks: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's rows, as FSDP2 splits dimension 0 (torch.chunk: the last may get none)."""
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(ranks)]
    for name, tensor in WHOLE.items():
        chunks = list(torch.chunk(tensor, ranks))
        chunks += [tensor[:0]] * (ranks - len(chunks))
        for rank, chunk in enumerate(chunks):
            shards[rank][name] = chunk.clone()  # its own memory, as a rank's shard is
    return shards


def _announcement(version: int, part: dict[str, torch.Tensor], rank: int) -> Announcement:
    specs, total = plan(part)
    manifest = Manifest(version, specs, total, 1 << 20, (0,) * -(-total // (1 << 20)))
    return Announcement(version, manifest.to_payload(), f"rank-{rank}".encode())


def _shapes() -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in WHOLE.items()}


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_the_parts_of_any_group_make_the_whole_again(ranks: int) -> None:
    shards = _shards(ranks)
    announced = compose(7, [_announcement(7, s, r) for r, s in enumerate(shards)], _shapes())
    addresses = [f"rank-{r}".encode() for r in range(ranks)]
    assert announced.version == 7 and announced.address == served_from(addresses)
    assert has_parts(announced.manifest) and part_count(announced.manifest) == ranks
    plans, shapes = part_plans(WeightsPlan(7, announced.manifest, "train-0", announced.address))
    assert [p.source for p in plans] == [f"train-0/part-{r}" for r in range(ranks)]
    assert [p.source_address for p in plans] == addresses
    # A relay serves each part from an address of its own: the plan names it.
    relayed = served_from([f"gen-3/{r}".encode() for r in range(ranks)])
    plans, _ = part_plans(WeightsPlan(7, announced.manifest, "gen-3", relayed))
    assert [p.source for p in plans] == [f"gen-3/part-{r}" for r in range(ranks)]
    assert [p.source_address for p in plans] == [f"gen-3/{r}".encode() for r in range(ranks)]
    whole = assemble(shards, shapes)
    assert whole.keys() == WHOLE.keys()
    for name, tensor in WHOLE.items():
        assert whole[name].dtype == tensor.dtype and torch.equal(whole[name], tensor), name


def test_a_whole_version_is_no_version_in_parts() -> None:
    whole = _announcement(1, dict(WHOLE), 0).manifest
    assert not has_parts(whole) and part_count(whole) == 1


@pytest.mark.parametrize(
    "address", [b"", b"rank-0", served_from([b"rank-0"]), served_from([b"a", b"b", b"c"])]
)
def test_a_source_without_an_address_for_each_part_is_refused(address: bytes) -> None:
    announced = compose(3, [_announcement(3, s, r) for r, s in enumerate(_shards(2))], _shapes())
    with pytest.raises(ManifestError, match="in 2 parts, and gen-1 gives no address for each"):
        part_plans(WeightsPlan(3, announced.manifest, "gen-1", address))


def test_the_assembled_tensors_outlive_the_parts_buffers() -> None:
    shards = _shards(2)
    whole = assemble(shards, _shapes())
    for shard in shards:
        for tensor in shard.values():
            tensor.zero_()
    assert torch.equal(whole["embed.weight"], WHOLE["embed.weight"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s[1].pop("bias"), "hold 1 rows of 2"),
        (lambda s: s[1].__setitem__("extra", torch.zeros(1)), r"name other tensors: \['extra'\]"),
        (lambda s: s[1].__setitem__("embed.weight", torch.zeros(3, 4)), "not of one shape"),
        (lambda s: s[1].__setitem__("norm.weight", torch.zeros(2)), "not of one shape"),
    ],
)
def test_parts_that_do_not_make_the_whole_are_refused_saying_why(change, message: str) -> None:
    shards = _shards(2)
    change(shards)
    parts = [_announcement(3, s, r) for r, s in enumerate(shards)]
    with pytest.raises(ManifestError, match=message):
        compose(3, parts, _shapes())
    good = compose(3, [_announcement(3, s, r) for r, s in enumerate(_shards(2))], _shapes())
    bad = dict(good.manifest, parts=[p.manifest for p in parts])
    with pytest.raises(ManifestError, match=message):
        part_plans(WeightsPlan(3, bad, "train-0", good.address))


def test_a_malformed_manifest_in_parts_is_refused() -> None:
    for manifest in ({"parts": []}, {"parts": 3, "shapes": {}}, {"version": 1, "shapes": {}}):
        with pytest.raises(ManifestError):
            part_plans(WeightsPlan(1, {"parts": None, **manifest}, "t", served_from([b"a"])))
    with pytest.raises(ValueError, match="parts of versions \\[2\\] in version 1"):
        compose(1, [_announcement(2, dict(WHOLE), 0)], _shapes())


def _chunk_rows(whole: int, rank: int, ranks: int) -> range:
    """A scorer rank's rows of a tensor as FSDP2 chunks them."""
    chunk = -(-whole // ranks)
    first = min(whole, rank * chunk)
    return range(first, min(whole, first + chunk))


@pytest.mark.parametrize(("published", "scoring"), [(2, 2), (2, 3), (3, 2), (4, 2), (2, 4)])
def test_a_scorer_rank_takes_its_own_rows_from_the_parts_whatever_the_sizes(
    published: int, scoring: int
) -> None:
    shards = _shards(published)
    announced = compose(5, [_announcement(5, s, r) for r, s in enumerate(shards)], _shapes())
    plans, _ = part_plans(WeightsPlan(5, announced.manifest, "train-0", announced.address))
    held = spans_of_parts(plans)
    for rank in range(scoring):
        wanted = {
            name: _chunk_rows(t.shape[0] if t.dim() else 1, rank, scoring)
            for name, t in WHOLE.items()
        }
        needed = parts_for({n: r for n, r in wanted.items() if r}, held)
        # Only the parts it needs are given: rows_from must not reach for the others.
        given = {index: shards[index] for index in needed}
        if published == scoring:
            assert needed == [rank]
        for name, rows in wanted.items():
            if not rows:
                continue
            got = rows_from(given, held, name, rows)
            expected = (
                WHOLE[name] if WHOLE[name].dim() == 0 else WHOLE[name][rows.start : rows.stop]
            )
            assert torch.equal(got, expected), (published, scoring, rank, name)


def test_rows_no_part_holds_are_refused() -> None:
    shards = _shards(2)
    announced = compose(5, [_announcement(5, s, r) for r, s in enumerate(shards)], _shapes())
    plans, _ = part_plans(WeightsPlan(5, announced.manifest, "train-0", announced.address))
    with pytest.raises(ValueError, match="no part holds rows 40-41 of 'bias'"):
        rows_from(dict(enumerate(shards)), spans_of_parts(plans), "bias", range(40, 41))


def _tensor_parallel(ranks: int) -> tuple[list[dict[str, torch.Tensor]], dict[str, int]]:
    """Parts as tensor-parallel ranks hold them: the embedding's rows, a row-parallel
    layer's columns, a norm whole on rank 0 only."""
    parts = []
    for rank in range(ranks):
        part = {
            "embed.weight": torch.chunk(WHOLE["embed.weight"], ranks)[rank],
            "proj.weight": torch.chunk(TP_PROJ, ranks, dim=1)[rank],
        }
        if rank == 0:
            part["norm.weight"] = WHOLE["norm.weight"]
        parts.append(part)
    return parts, {"proj.weight": 1}


TP_PROJ = torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6)
TP_WHOLE = {
    "embed.weight": WHOLE["embed.weight"],
    "proj.weight": TP_PROJ,
    "norm.weight": WHOLE["norm.weight"],
}


@pytest.mark.parametrize("ranks", [2, 3])
def test_parts_split_along_columns_make_the_whole_and_give_a_scorer_its_rows(ranks: int) -> None:
    parts, dims = _tensor_parallel(ranks)
    shapes = {name: tuple(t.shape) for name, t in TP_WHOLE.items()}
    announced = compose(4, [_announcement(4, p, r) for r, p in enumerate(parts)], shapes, dims)
    assert announced.manifest["dims"] == {"proj.weight": 1}
    plans, got_shapes = part_plans(WeightsPlan(4, announced.manifest, "train-0", announced.address))
    held_dims = split_dims(announced.manifest)
    whole = assemble(parts, got_shapes, held_dims)
    assert all(torch.equal(whole[n], t) for n, t in TP_WHOLE.items())
    held = spans_of_parts(plans, held_dims)
    # A scorer rank of 2 holding rows 3-5 of the projection needs every part (each has
    # some columns of those rows), and rows 0-3 of the embedding from the first parts.
    wanted = {"proj.weight": range(3, 5), "embed.weight": range(0, 4)}
    needed = parts_for(wanted, held, held_dims)
    assert needed == list(range(ranks))
    given = {index: parts[index] for index in needed}
    assert torch.equal(rows_from(given, held, "proj.weight", range(3, 5), 1), TP_PROJ[3:5])
    assert torch.equal(
        rows_from(given, held, "embed.weight", range(0, 4)), WHOLE["embed.weight"][:4]
    )


def test_parts_split_along_a_dimension_they_lack_or_not_adding_up_are_refused() -> None:
    parts, _ = _tensor_parallel(2)
    shapes = {name: tuple(t.shape) for name, t in TP_WHOLE.items()}
    announced = [_announcement(4, p, r) for r, p in enumerate(parts)]
    with pytest.raises(ManifestError, match=r"'norm\.weight' has no dimension 1 to split"):
        compose(4, announced, shapes, {"proj.weight": 1, "norm.weight": 1})
    with pytest.raises(ManifestError, match="hold 3 slices of dimension 1 of 6"):
        bad = [_announcement(4, {**parts[0], "proj.weight": TP_PROJ[:, :3]}, 0),
               _announcement(4, {**parts[1], "proj.weight": TP_PROJ[:, :0]}, 1)]  # fmt: skip
        compose(4, bad, shapes, {"proj.weight": 1})
