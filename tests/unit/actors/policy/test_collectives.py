"""Nothing pickled passes between the ranks of a group: torch's object collectives are
never called, and what replaces them (actors/policy/collectives.py) carries plain data
whose tensor layouts are checked before anything is allocated for them."""

from __future__ import annotations

import ast
import datetime

import msgpack
import pytest
import torch
import torch.distributed as dist

from asyncrl.actors.policy.collectives import (
    all_gather_bytes,
    all_gather_data,
    broadcast_data,
    layout_of,
    read_layout,
)
from tests.unit.test_layout import source_modules

# torch.distributed's collectives that pickle what they carry (and unpickle what they get)
PICKLING = {
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
}


def test_no_source_module_calls_a_collective_that_pickles() -> None:
    found = []
    for name, path in source_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            called = node.attr if isinstance(node, ast.Attribute) else None
            called = node.id if isinstance(node, ast.Name) else called
            if called in PICKLING:
                found.append(f"{name}:{node.lineno} {called}")
    assert found == []


@pytest.fixture(scope="module")
def one_rank():
    """A group of one on gloo: the collectives' own code runs, with no peer to wait for."""
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(30)
    )
    yield
    dist.destroy_process_group()


def test_plain_data_goes_round(one_rank) -> None:
    assert all_gather_bytes(b"") == [b""]
    assert all_gather_bytes(b"\x00abc") == [b"\x00abc"]
    assert all_gather_data([3, 1, 2]) == [[3, 1, 2]]
    state = {"w": torch.zeros(2, 3, dtype=torch.bfloat16), "b": torch.zeros(0)}
    sent = broadcast_data(layout_of(state), src=0)
    assert read_layout(sent) == {"w": ((2, 3), torch.bfloat16), "b": ((0,), torch.float32)}


@pytest.mark.parametrize(
    ("sent", "named"),
    [
        ([1, 2], "a map"),
        ({"w": [[2], "float32", 0]}, "not \\[shape, dtype\\]"),
        ({"w": [[-1], "float32"]}, "not sizes"),
        ({"w": [[2.5], "float32"]}, "not sizes"),
        ({"w": [[True], "float32"]}, "not sizes"),
        ({"w": [[2], "Tensor"]}, "not a torch dtype"),
        ({"w": [[2], "load"]}, "not a torch dtype"),
        ({"w": [[2], 7]}, "not a torch dtype"),
    ],
)
def test_a_crafted_layout_is_refused_by_name(sent: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        read_layout(msgpack.unpackb(msgpack.packb(sent), strict_map_key=False))
