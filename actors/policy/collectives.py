"""What the ranks of a group tell each other besides tensors: MessagePack in byte tensors.

torch's object collectives (``all_gather_object``, ``broadcast_object_list``) pickle what
they carry, and a rank that unpickles runs whatever the bytes say. These carry plain data
only (MessagePack: numbers, text, bytes, lists, maps), and a tensor layout read from
another rank is checked before anything is allocated for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import torch
import torch.distributed as dist

__all__ = [
    "Layout",
    "all_gather_bytes",
    "all_gather_data",
    "broadcast_data",
    "layout_of",
    "read_layout",
]

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]  # name -> (shape, dtype)


def all_gather_bytes(
    data: bytes, group: dist.ProcessGroup | None = None, device: torch.device | None = None
) -> list[bytes]:
    """Every rank's ``data``, in rank order (a collective over ``group``)."""
    device = device or _device(group)
    ranks = dist.get_world_size(group)
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(ranks)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    width = max(1, *lengths)
    mine = torch.zeros(width, dtype=torch.uint8, device=device)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else 0
    every = [torch.empty_like(mine) for _ in range(ranks)]
    dist.all_gather(every, mine, group=group)
    return [t[:n].cpu().numpy().tobytes() for t, n in zip(every, lengths, strict=True)]


def all_gather_data(
    value: Any, group: dist.ProcessGroup | None = None, device: torch.device | None = None
) -> list[Any]:
    """Every rank's ``value`` (plain data), in rank order."""
    return [_unpack(b) for b in all_gather_bytes(msgpack.packb(value), group, device)]


def broadcast_data(
    value: Any,
    src: int,
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
) -> Any:
    """``value`` (plain data) of the rank ``src`` (a global rank), on every rank."""
    device = device or _device(group)
    data = msgpack.packb(value) if dist.get_rank() == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    buffer = torch.zeros(max(1, int(size.item())), dtype=torch.uint8, device=device)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(buffer, src=src, group=group)
    return _unpack(buffer[: int(size.item())].cpu().numpy().tobytes())


def layout_of(state: Mapping[str, torch.Tensor]) -> dict[str, list]:
    """Tensors' names, shapes and dtypes as plain data (see :func:`read_layout`)."""
    return {name: [list(t.shape), _dtype_name(t.dtype)] for name, t in state.items()}


def read_layout(data: Any) -> Layout:
    """A layout another rank sent; ValueError naming what is not a layout."""
    if not isinstance(data, dict):
        raise ValueError(f"a tensor layout is a map, not {type(data).__name__}")
    layout: Layout = {}
    for name, entry in data.items():
        if not (isinstance(name, str) and isinstance(entry, list) and len(entry) == 2):
            raise ValueError(f"a tensor layout entry {str(name)[:100]!r} is not [shape, dtype]")
        shape, dtype = entry
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"tensor {name[:100]!r}: its shape {str(shape)[:100]} is not sizes")
        layout[name] = (tuple(shape), _dtype(dtype))
    return layout


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: object) -> torch.dtype:
    found = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{str(name)[:100]!r} is not a torch dtype")
    return found


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, strict_map_key=False)


def _device(group: dist.ProcessGroup | None) -> torch.device:
    """Where the group's backend takes tensors: NCCL's on this rank's GPU, gloo's on CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
