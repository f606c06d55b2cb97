"""A scorer group's ranks taking their own rows of a version published in parts.

A group of FSDP2 ranks (logp with ``pipeline.workers.logp`` > 1) holds each tensor's
rows split over its ranks. When the trainer publishes every version from every rank
(transport/weights/parts.py), no rank of the scorer group needs the whole version: each
fetches the parts holding its own rows (with groups of one size, rank r the trainer's part
r), straight from the source the scheduler named, and copies its rows into its shard.

The leader drives it through the weight plane's receiver contract
(:class:`GroupRowsReceiver`), so the scorer follows versions as any worker does:

- ``want``: the leader orders the others to fetch (``Order.FETCH``, the plan as plain
  data) and starts its own fetch; every rank fetches in the background;
- ``poll``: once the leader's rows are in (or failed), it asks every rank whether its
  rows arrived (``Order.FETCHED``, a collective). All in: the version is handed over;
  else it is a failed plan naming the source, every rank keeps the parts it has, and the
  next plan fetches only what is missing;
- the actor then loads it (``Order.LOAD``): each rank copies its rows into its shard.

No rank holds the whole model, and the bytes reaching each rank scale as 1/ranks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import msgpack
import torch

from asyncrl.transport.weights import NeedsPlan, Received, WeightReceiver, WeightsPlan
from asyncrl.transport.weights.layout import ManifestError
from asyncrl.transport.weights.parts import (
    part_count,
    part_plans,
    parts_for,
    rows_from,
    spans_of_parts,
    split_dims,
)

from ..policy.collectives import all_gather_data
from ..policy.sharding import is_dtensor, local_part
from .gang import Gang, Order

__all__ = [
    "ROWS",
    "GroupRowsReceiver",
    "ShardRows",
    "follower_order",
    "own_rows",
    "pack_plan",
    "unpack_plan",
]

ROWS = b"rows"  # the body of Order.LOAD when each rank loads the rows it fetched

# A rank waits for its rows this much past its receivers' own stall timeout, which ends
# every fetch that stopped moving: only a receiver that never answers hits it.
_GRACE_S = 30.0


def own_rows(model: torch.nn.Module) -> dict[str, range]:
    """Each tensor's rows of the whole that this rank of a sharded ``model`` holds (an
    FSDP2 shard along dimension 0, chunked as ``torch.chunk`` does; a tensor not
    sharded: all of its rows), by state-dict name; a tied output layer is its embedding.
    ValueError for a shard that is not such a chunk."""
    rows = {}
    for name, value in _shard_tensors(model).items():
        whole = value.shape[0] if value.dim() else 1
        if is_dtensor(value) and value.placements[0].is_shard(0):
            ranks, rank = value.device_mesh.size(), value.device_mesh.get_local_rank()
            chunk = math.ceil(whole / ranks)
            first = min(whole, rank * chunk)
            mine = range(first, min(whole, first + chunk))
            if value.to_local().shape[0] != len(mine):
                raise ValueError(
                    f"{name!r}: rank {rank} of {ranks} holds {value.to_local().shape[0]} "
                    f"rows of {whole}, not the chunk {mine.start}-{mine.stop}"
                )
            rows[name] = mine
        else:
            rows[name] = range(whole)
    return rows


def _shard_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the embedding, published once by that name
    return state


def pack_plan(plan: WeightsPlan, local: bool) -> bytes:
    """A plan as an order's body, with whether the run is on one host (what a rank's
    receivers may be open to): plain data (MessagePack)."""
    return msgpack.packb([local, plan.version, plan.manifest, plan.source, plan.source_address])


def unpack_plan(body: bytes) -> tuple[WeightsPlan, bool]:
    local, version, manifest, source, address = msgpack.unpackb(body)
    return WeightsPlan(int(version), manifest, str(source), bytes(address)), bool(local)


class ShardRows:
    """One rank's fetch of its rows of versions in ``parts`` parts: a receiver for each
    part it needs (made by ``receiver(part, local)``, ``local``: whether the run is on
    one host), the parts in, and the copy into its shard."""

    def __init__(
        self,
        model: torch.nn.Module,
        parts: int,
        receiver: Callable[[int, bool], WeightReceiver],
        stall_timeout_s: float,
    ) -> None:
        self.model = model  # sharded: FSDP2 over the group
        self.parts = parts
        self.rows = own_rows(model)
        self.shapes = {name: tuple(t.shape) for name, t in _shard_tensors(model).items()}
        self._make = receiver
        self._receivers: dict[int, WeightReceiver] = {}
        self.plan: WeightsPlan | None = None
        self._held: list[dict[str, range]] = []  # each part's slice of the whole
        self._dims: dict[str, int] = {}  # each tensor's split dimension, where not 0
        self._needed: list[int] = []
        self._got: dict[int, Received] = {}
        self._failure = ""  # why the plan failed here ("" while it has not)
        self._patience_s = stall_timeout_s + _GRACE_S
        self.started = 0.0  # when the version was first planned here
        self._asked = 0.0  # when the last plan for it came

    def want(self, plan: WeightsPlan, local: bool) -> None:
        """Fetch this rank's parts of ``plan``'s version (in the background); the parts
        of that version already in are kept. ManifestError for a plan not in this
        group's parts."""
        if part_count(plan.manifest) != self.parts:
            raise ManifestError(
                f"version {plan.version} is in {part_count(plan.manifest)} part(s); this "
                f"group takes versions in {self.parts} (the trainer's group)"
            )
        plans, shapes = part_plans(plan)
        if shapes != self.shapes:
            odd = sorted(n for n in shapes.keys() | self.shapes.keys()
                         if shapes.get(n) != self.shapes.get(n))  # fmt: skip
            raise ManifestError(
                f"version {plan.version}'s tensors do not fit this model: {odd[:3]} "
                f"(announced {[shapes.get(n) for n in odd[:3]]}, held "
                f"{[self.shapes.get(n) for n in odd[:3]]})"
            )
        if self.plan is None or plan.version != self.plan.version:
            self._got, self.started = {}, time.monotonic()
            self._dims = split_dims(plan.manifest)
            self._held = spans_of_parts(plans, self._dims)
            self._needed = parts_for(self.rows, self._held, self._dims)
        self.plan, self._failure, self._asked = plan, "", time.monotonic()
        for index in self._needed:
            if index not in self._got:
                if index not in self._receivers:
                    self._receivers[index] = self._make(index, local)
                self._receivers[index].want(plans[index])

    def outcome(self) -> str | None:
        """ "" once every part this rank needs is in; why not, once one failed; None
        while they are on their way."""
        plan = self.plan
        if plan is None:
            return "no plan"
        for index in self._needed:
            if index in self._got:
                continue
            got = self._receivers[index].poll()
            if isinstance(got, Received) and got.version == plan.version:
                self._got[index] = got
            elif isinstance(got, NeedsPlan) and got.version == plan.version:
                self._failure = f"part {index} from {plan.source}: {got.reason}"
        if all(index in self._got for index in self._needed):
            return ""
        if not self._failure and time.monotonic() - self._asked > self._patience_s:
            self._failure = f"its parts not in after {self._patience_s:g} s"
        return self._failure or None

    @property
    def nbytes(self) -> int:
        """The bytes of the parts in, of the version being fetched."""
        return sum(got.nbytes for got in self._got.values())

    def wait(self) -> str:
        """:meth:`outcome`, once there is one."""
        while (said := self.outcome()) is None:
            time.sleep(0.005)
        return said

    def load(self) -> None:
        """Copy this rank's rows of the version in into its shard (no collective)."""
        parts = {index: got.state for index, got in self._got.items()}
        tensors = _shard_tensors(self.model)
        with torch.no_grad():
            for name, rows in self.rows.items():
                if not rows:
                    continue
                target = tensors[name]
                local = local_part(target)
                mine = rows_from(parts, self._held, name, rows, self._dims.get(name, 0))
                local.copy_(mine.view_as(local))
        self._got = {}  # the receivers keep their buffers; the shard has its own copy

    def close(self) -> None:
        for receiver in self._receivers.values():
            receiver.close()


class GroupRowsReceiver:
    """The leader's side (see the module): a weight receiver whose versions arrive in the
    shards of every rank of ``gang``. It relays nothing."""

    address = b""

    def __init__(self, gang: Gang, rows: ShardRows, local: bool) -> None:
        self.gang, self.rows, self.local = gang, rows, local
        self._fetching: WeightsPlan | None = None
        self._handed = -1

    @property
    def target(self) -> int | None:
        return self._fetching.version if self._fetching is not None else None

    def want(self, plan: WeightsPlan) -> None:
        if plan.version <= self._handed:
            return
        current = self._fetching
        if current is not None and (
            current.version > plan.version
            or (current.version == plan.version and current.source == plan.source)
        ):
            return  # on a newer version, or on this one from this source already
        self.rows.want(plan, self.local)  # ManifestError before the others are told
        self.gang.lead(Order.FETCH, lambda: None, pack_plan(plan, self.local))
        self._fetching = plan

    def poll(self) -> Received | NeedsPlan | None:
        plan = self._fetching
        if plan is None or self.rows.outcome() is None:
            return None
        said = self.gang.lead(Order.FETCHED, lambda: agree(self.rows))
        self._fetching = None
        failures = [f"rank {rank}: {why}" for rank, why in enumerate(said) if why]
        if failures:
            return NeedsPlan(plan.version, plan.source, "; ".join(failures))
        self._handed = plan.version
        # Nothing whole to hand over: each rank loads its rows (Order.LOAD with ROWS).
        # The bytes are the leader's; the others' are theirs.
        elapsed = time.monotonic() - self.rows.started
        return Received(plan.version, {}, self.rows.nbytes, elapsed, plan.source)

    def loaded(self, received: Received) -> None:
        """Each rank's shard has its own copy: nothing to keep."""

    def close(self) -> None:
        """The rows are the actor's, which closes them after the group left."""


def agree(rows: ShardRows) -> list[str]:
    """Every rank's word on its rows of the version being fetched ("" for in), in rank
    order: a collective, each rank waiting for its own fetch first."""
    return [str(said) for said in all_gather_data(rows.wait())]


def follower_order(rows: ShardRows, order: Order, body: bytes) -> bool:
    """Carry out a follower's part of ``order`` if it is about rows (FETCH, FETCHED, LOAD
    with ROWS); whether it was."""
    if order is Order.FETCH:
        rows.want(*unpack_plan(body))
    elif order is Order.FETCHED:
        agree(rows)
    elif order is Order.LOAD and body == ROWS:
        rows.load()
    else:
        return False
    return True
