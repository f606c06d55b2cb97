"""A scorer rank's own rows of a version in parts (actors/training/shard_rows.py), checked
before anything is fetched: a plan in another number of parts, or whose tensors do not
fit the model, is refused saying what differs; the plan travels to the other ranks as
plain data."""

from __future__ import annotations

import pytest
import torch

from asyncrl.actors.training.shard_rows import ShardRows, own_rows, pack_plan, unpack_plan
from asyncrl.transport.messages import WeightsPlan
from asyncrl.transport.weights.base import Announcement
from asyncrl.transport.weights.layout import Manifest, ManifestError, plan
from asyncrl.transport.weights.parts import compose


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2, bias=False))


def _plan(state: dict[str, torch.Tensor], parts: int) -> WeightsPlan:
    announced = []
    for rank in range(parts):
        part = {n: torch.chunk(t, parts)[rank] for n, t in state.items()}
        specs, total = plan(part)
        manifest = Manifest(1, specs, total, 1 << 20, (0,))
        announced.append(Announcement(1, manifest.to_payload(), f"rank-{rank}".encode()))
    whole = compose(1, announced, {n: tuple(t.shape) for n, t in state.items()})
    return WeightsPlan(1, whole.manifest, "train-0", whole.address)


def _refusing(parts: int) -> ShardRows:
    def no_receiver(part: int, local: bool):
        raise AssertionError("a refused plan fetches nothing")

    return ShardRows(_model(), parts, no_receiver, 1.0)


def test_a_model_not_sharded_holds_every_row() -> None:
    assert own_rows(_model()) == {
        "0.weight": range(4),
        "0.bias": range(4),
        "1.weight": range(2),
    }


def test_a_plan_in_another_number_of_parts_is_refused() -> None:
    state = {n: t.detach() for n, t in _model().state_dict().items()}
    with pytest.raises(ManifestError, match=r"version 1 is in 2 part.*takes versions in 3"):
        _refusing(3).want(_plan(state, 2), True)


def test_a_plan_whose_tensors_do_not_fit_the_model_is_refused_naming_them() -> None:
    state = {n: t.detach() for n, t in _model().state_dict().items()}
    state["0.weight"] = torch.zeros(6, 3)
    with pytest.raises(ManifestError, match=r"do not fit this model: \['0.weight'\]"):
        _refusing(2).want(_plan(state, 2), True)


def test_a_plan_travels_to_the_other_ranks_as_plain_data() -> None:
    state = {n: t.detach() for n, t in _model().state_dict().items()}
    sent = _plan(state, 2)
    assert unpack_plan(pack_plan(sent, False)) == (sent, False)
