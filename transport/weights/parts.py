"""A version published by every rank of a group, each rank its own part.

A rank of a sharded group holds a slice of every parameter along one dimension, in rank
order, possibly none: an FSDP2 shard's rows (dimension 0); a tensor-parallel rank's rows
of a column-parallel layer or columns of a row-parallel one (dimension 1); a tensor whole,
held by one rank only (a pipeline stage's layers, a norm). Each tensor's split dimension
is announced with its whole shape. Each rank stages and serves its part with a publisher of its
own, so no rank holds the whole model for publishing and each host sends only its own
bytes. Rank 0 announces the version as its parts (:func:`compose`): each part's manifest
and each tensor's whole shape, served from one address per part (:func:`served_from`).
A receiver reads the plan into one plan per part (:func:`part_plans`), fetches them in
parallel, and lays each tensor's rows into a whole one (:func:`assemble`), whatever the
group's size.

Whoever serves a version in parts gives one address per part: the ranks, or a relay (a
receiver whose part receivers relay, each the part it fetched). So the relay tree of the
weight routes works as for versions whole: a plan names one source and its address.

A group of ranks that holds the model sharded by rows (a scorer's FSDP2 group) needs
only its own rows of each tensor: :func:`spans_of_parts` says which slice of the whole
each part holds, :func:`parts_for` which parts a rank's rows are in, and :func:`rows_from`
copies a rank's rows out of those parts, whatever the publishing group was.

Pure: no sockets, no threads. The receiver that fetches the parts is
:class:`~.parts_receiver.PartsReceiver`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgpack
import torch

from ..messages import WeightsPlan
from .base import Announcement
from .layout import Manifest, ManifestError

__all__ = [
    "PARTS",
    "Spans",
    "SplitDims",
    "WholeShapes",
    "assemble",
    "compose",
    "has_parts",
    "part_count",
    "part_plans",
    "parts_for",
    "rows_from",
    "served_from",
    "spans_of_parts",
    "split_dims",
    "whole_shapes",
]

PARTS = "parts"  # the manifest key of a version in parts

WholeShapes = Mapping[str, tuple[int, ...]]  # each tensor's shape, whole
SplitDims = Mapping[str, int]  # each tensor's split dimension, where it is not 0
Spans = Mapping[str, range]  # of each tensor, the slice of the whole along its split dimension


def compose(
    version: int,
    parts: Sequence[Announcement],
    shapes: WholeShapes,
    dims: SplitDims | None = None,
) -> Announcement:
    """Rank 0's announcement of ``version`` from every publishing rank's own (in rank
    order), each tensor's whole shape and, where it is not 0, the dimension it is split
    along. ValueError if the parts do not make the whole."""
    if not parts:
        raise ValueError(f"version {version} has no parts")
    wrong = [a.version for a in parts if a.version != version]
    if wrong:
        raise ValueError(f"parts of versions {wrong} in version {version}")
    split = {name: int(d) for name, d in (dims or {}).items() if d}
    manifest: dict[str, object] = {
        "version": version,
        PARTS: [a.manifest for a in parts],
        "shapes": {name: list(shape) for name, shape in shapes.items()},
    }
    if split:
        manifest["dims"] = split
    _layout(version, [Manifest.from_payload(a.manifest) for a in parts], shapes, split)
    return Announcement(version, manifest, served_from([a.address for a in parts]))


def whole_shapes(parts: Sequence[Announcement], dims: SplitDims) -> dict[str, tuple[int, ...]]:
    """Each tensor's whole shape, from the parts' slices of it added up along its split
    dimension (for a group none of whose ranks knows every tensor: pipeline stages)."""
    shapes: dict[str, list[int]] = {}
    for announced in parts:
        for spec in Manifest.from_payload(announced.manifest).tensors:
            dim = dims.get(spec.name, 0)
            if spec.name not in shapes or not spec.shape:
                shapes[spec.name] = list(spec.shape)
            elif dim < len(spec.shape):
                shapes[spec.name][dim] += spec.shape[dim]
    return {name: tuple(shape) for name, shape in shapes.items()}


def served_from(addresses: Sequence[bytes]) -> bytes:
    """The address of a version in parts: each part's, in order (b"" for a part served
    without a peer, as files are)."""
    return msgpack.packb(list(addresses))


def has_parts(manifest: object) -> bool:
    """Whether ``manifest`` announces a version in parts."""
    return isinstance(manifest, dict) and PARTS in manifest


def part_count(manifest: object) -> int:
    """How many parts ``manifest`` announces (1: a version whole)."""
    if not has_parts(manifest):
        return 1
    parts = manifest[PARTS]  # type: ignore[index]
    return len(parts) if isinstance(parts, list) else 0


def split_dims(manifest: Mapping[str, object]) -> dict[str, int]:
    """Each tensor's split dimension where it is not 0, as ``manifest`` announces it.
    ManifestError for one that is no mapping of names to dimensions."""
    dims = manifest.get("dims", {})
    if not isinstance(dims, dict) or not all(
        isinstance(n, str) and type(d) is int and d >= 0 for n, d in dims.items()
    ):
        raise ManifestError(f"a manifest in parts with split dimensions {str(dims)[:80]}")
    return dict(dims)


def part_plans(plan: WeightsPlan) -> tuple[list[WeightsPlan], dict[str, tuple[int, ...]]]:
    """One plan per part of ``plan``'s version, each from the plan's source at that part's
    address (named ``SOURCE/part-R``), and each tensor's whole shape. ManifestError,
    saying what is wrong, for a manifest whose parts do not make the whole, or a source
    that does not give an address for each part."""
    manifest = plan.manifest
    try:
        parts = list(manifest[PARTS])
        shapes = {str(n): tuple(int(d) for d in s) for n, s in manifest["shapes"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ManifestError(f"a manifest in parts malformed: {error!r}") from None
    if not parts:
        raise ManifestError("a manifest in parts names no part")
    addresses = _addresses(plan, len(parts))
    manifests = [Manifest.from_payload(m, version=plan.version) for m in parts]
    _layout(plan.version, manifests, shapes, split_dims(manifest))
    plans = [
        WeightsPlan(plan.version, m, f"{plan.source}/part-{rank}", address)
        for rank, (m, address) in enumerate(zip(parts, addresses, strict=True))
    ]
    return plans, shapes


def _addresses(plan: WeightsPlan, count: int) -> list[bytes]:
    try:
        addresses = msgpack.unpackb(plan.source_address)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError):
        addresses = None
    if (
        not isinstance(addresses, list)
        or len(addresses) != count
        or not all(isinstance(a, bytes) for a in addresses)
    ):
        raise ManifestError(
            f"version {plan.version} is in {count} parts, and {plan.source or 'its source'} "
            f"gives no address for each ({len(plan.source_address)} bytes)"
        )
    return addresses


def assemble(
    parts: Sequence[Mapping[str, torch.Tensor]],
    shapes: WholeShapes,
    dims: SplitDims | None = None,
) -> dict[str, torch.Tensor]:
    """Each tensor whole, its slices taken from the parts in order along its split
    dimension (a part without it holds none of it): new tensors, which outlive the parts'
    buffers."""
    dims = dims or {}
    whole = {}
    for name, shape in shapes.items():
        pieces = [part[name] for part in parts if name in part]
        if not shape:  # a scalar is in one part only
            whole[name] = pieces[0].clone()
        else:
            whole[name] = torch.cat(pieces, dim=dims.get(name, 0)).reshape(shape)
    return whole


def spans_of_parts(
    plans: Sequence[WeightsPlan], dims: SplitDims | None = None
) -> list[dict[str, range]]:
    """For each part (``part_plans``' plans, in order), the slice of the whole each of its
    tensors holds along the tensor's split dimension; a scalar is row 0 of the part that
    holds it."""
    dims = dims or {}
    taken: dict[str, int] = {}
    out = []
    for plan in plans:
        spans = {}
        for spec in Manifest.from_payload(plan.manifest, version=plan.version).tensors:
            first = taken.get(spec.name, 0)
            count = spec.shape[dims.get(spec.name, 0)] if spec.shape else 1
            spans[spec.name] = range(first, first + count)
            taken[spec.name] = first + count
        out.append(spans)
    return out


def parts_for(wanted: Spans, held: Sequence[Spans], dims: SplitDims | None = None) -> list[int]:
    """The parts (indices into ``held``, from :func:`spans_of_parts`) holding any of the
    ``wanted`` rows: for a tensor split along another dimension, every part holding some
    of it (each holds some columns of every row)."""
    dims = dims or {}

    def holds(spans: Spans, name: str, want: range) -> bool:
        span = spans.get(name, range(0))
        return bool(span) if dims.get(name, 0) else bool(_overlap(span, want))

    return [
        index
        for index, spans in enumerate(held)
        if any(want and holds(spans, name, want) for name, want in wanted.items())
    ]


def rows_from(
    parts: Mapping[int, Mapping[str, torch.Tensor]],
    held: Sequence[Spans],
    name: str,
    want: range,
    dim: int = 0,
) -> torch.Tensor:
    """Rows ``want`` of tensor ``name`` (split along ``dim``), taken from ``parts`` (index
    -> that part's tensors: at least the :func:`parts_for` those rows) in order.
    ValueError if no part holds them."""
    pieces = []
    for index, spans in enumerate(held):
        span = spans.get(name, range(0))
        if not span:
            continue
        if dim:  # every part holding it has some columns of every row
            pieces.append(parts[index][name][want.start : want.stop])
            continue
        overlap = _overlap(span, want)
        if overlap:
            tensor = parts[index][name]
            if tensor.dim() == 0:
                return tensor
            pieces.append(tensor[overlap.start - span.start : overlap.stop - span.start])
    if not pieces:
        raise ValueError(f"no part holds rows {want.start}-{want.stop} of {name!r}")
    return torch.cat(pieces, dim=dim) if len(pieces) != 1 else pieces[0]


def _overlap(a: range, b: range) -> range:
    return range(max(a.start, b.start), max(max(a.start, b.start), min(a.stop, b.stop)))


@dataclass(frozen=True)
class _Slice:
    dtype: str
    count: int  # along the split dimension
    rest: tuple[int, ...]  # the other dimensions

    @classmethod
    def of(cls, dtype: str, shape: tuple[int, ...], dim: int) -> _Slice:
        if not shape:
            return cls(dtype, 1, ())
        return cls(dtype, shape[dim], shape[:dim] + shape[dim + 1 :])


def _layout(
    version: int, manifests: Sequence[Manifest], shapes: WholeShapes, dims: SplitDims
) -> None:
    """ManifestError unless the parts' tensors make each whole tensor: the same names, one
    dtype each, the same other dimensions, and slices adding up to the whole along the
    split dimension."""
    seen: dict[str, list[tuple[str, tuple[int, ...]]]] = {}  # name -> each part's dtype, shape
    for manifest in manifests:
        if manifest.version != version:
            raise ManifestError(f"a part of version {manifest.version} in version {version}")
        for spec in manifest.tensors:
            seen.setdefault(spec.name, []).append((spec.dtype, spec.shape))
    if seen.keys() != set(shapes):
        odd = sorted(seen.keys() ^ set(shapes))[:3]
        raise ManifestError(f"version {version}: the parts and the whole name other tensors: {odd}")
    for name, held in seen.items():
        dim, shape = dims.get(name, 0), tuple(shapes[name])
        if dim and any(dim >= len(s) for s in (shape, *(s for _, s in held))):
            raise ManifestError(f"version {version}: {name!r} has no dimension {dim} to split")
        whole = _Slice.of(held[0][0], shape, dim)
        pieces = [_Slice.of(dtype, s, dim) for dtype, s in held]
        if len({p.dtype for p in pieces}) != 1 or any(p.rest != whole.rest for p in pieces):
            raise ManifestError(f"version {version}: the parts of {name!r} are not of one shape")
        if sum(p.count for p in pieces) != whole.count:
            what = "rows" if dim == 0 else f"slices of dimension {dim}"
            raise ManifestError(
                f"version {version}: the parts of {name!r} hold "
                f"{sum(p.count for p in pieces)} {what} of {whole.count}"
            )
