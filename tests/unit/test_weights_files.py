"""The files weight sync: whole versions appear atomically, old ones are pruned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.transport.weights import WeightSync, make_weight_sync
from asyncrl.transport.weights.files import FileWeightSync


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(4, 3, generator=g), "b.bias": torch.randn(5, generator=g)}


def test_a_published_version_is_fetched_byte_exact(tmp_path: Path) -> None:
    sync = make_weight_sync("files", tmp_path)
    assert isinstance(sync, WeightSync)
    sync.publish(3, state(3))
    fetched = sync.fetch(3)
    assert fetched is not None and fetched.version == 3
    assert fetched.nbytes == (12 + 5) * 4
    for name, tensor in state(3).items():
        assert torch.equal(fetched.state[name], tensor)


def test_old_versions_are_pruned_and_fetch_says_so(tmp_path: Path) -> None:
    sync = FileWeightSync(tmp_path, keep=3)
    for version in range(1, 7):
        sync.publish(version, state(version))
    assert sync.fetch(3) is None and sync.fetch(7) is None
    assert [sync.fetch(v) is not None for v in (4, 5, 6)] == [True, True, True]
    assert not list(tmp_path.glob(".*"))  # no staging file left behind


def test_a_damaged_file_is_not_loaded(tmp_path: Path) -> None:
    sync = FileWeightSync(tmp_path)
    sync.publish(1, state(1))
    sync.path(1).write_bytes(sync.path(1).read_bytes()[:40])
    assert sync.fetch(1) is None


def test_an_unknown_strategy_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"weights\.strategy='ucx'"):
        make_weight_sync("ucx", tmp_path)
