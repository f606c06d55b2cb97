"""A version in parts (transport/weights/parts.py): rank 0's announcement of every rank's
part, one plan per part for a receiver, and the parts laid into whole tensors, whatever
the group's size and however unevenly its rows fall."""

from __future__ import annotations

import pytest
import torch

from asyncrl.transport.messages import WeightsPlan
from asyncrl.transport.weights.base import Announcement
from asyncrl.transport.weights.layout import Manifest, ManifestError, plan
from asyncrl.transport.weights.parts import assemble, compose, has_parts, part_plans

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
    assert announced.version == 7 and announced.address == b"rank-0"
    assert has_parts(announced.manifest)
    plans, shapes = part_plans(WeightsPlan(7, announced.manifest, "train-0", b"rank-0"))
    assert [p.source for p in plans] == [f"train-0/part-{r}" for r in range(ranks)]
    assert [p.source_address for p in plans] == [f"rank-{r}".encode() for r in range(ranks)]
    whole = assemble(shards, shapes)
    assert whole.keys() == WHOLE.keys()
    for name, tensor in WHOLE.items():
        assert whole[name].dtype == tensor.dtype and torch.equal(whole[name], tensor), name


def test_a_whole_version_is_no_version_in_parts() -> None:
    assert not has_parts(_announcement(1, dict(WHOLE), 0).manifest)


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
    bad = dict(good.manifest, parts=[{"manifest": p.manifest, "address": p.address} for p in parts])
    with pytest.raises(ManifestError, match=message):
        part_plans(WeightsPlan(3, bad, "train-0", b""))


def test_a_malformed_manifest_in_parts_is_refused() -> None:
    for manifest in ({"parts": []}, {"parts": 3, "shapes": {}}, {"version": 1, "shapes": {}}):
        with pytest.raises(ManifestError):
            part_plans(WeightsPlan(1, {"parts": None, **manifest}, "t", b""))
    with pytest.raises(ValueError, match="parts of versions \\[2\\] in version 1"):
        compose(1, [_announcement(2, dict(WHOLE), 0)], _shapes())
