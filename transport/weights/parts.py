"""A version published by every rank of a group, each rank its own part.

A rank of a sharded group (FSDP2) holds some rows of every parameter: along dimension 0,
in rank order, possibly none. Each rank stages and serves its part with a publisher of its
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
only its own rows of each tensor: :func:`rows_of_parts` says which rows of the whole each
part holds, :func:`parts_for` which parts a rank's rows are in, and :func:`rows_from`
copies a rank's rows out of those parts, whatever the publishing group's size was.

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
    "Rows",
    "WholeShapes",
    "assemble",
    "compose",
    "has_parts",
    "part_count",
    "part_plans",
    "parts_for",
    "rows_from",
    "rows_of_parts",
    "served_from",
]

PARTS = "parts"  # the manifest key of a version in parts

WholeShapes = Mapping[str, tuple[int, ...]]  # each tensor's shape, whole


def compose(version: int, parts: Sequence[Announcement], shapes: WholeShapes) -> Announcement:
    """Rank 0's announcement of ``version`` from every rank's own (in rank order) and
    each tensor's whole shape. ValueError if the parts do not make the whole."""
    if not parts:
        raise ValueError(f"version {version} has no parts")
    wrong = [a.version for a in parts if a.version != version]
    if wrong:
        raise ValueError(f"parts of versions {wrong} in version {version}")
    manifest: dict[str, object] = {
        "version": version,
        PARTS: [a.manifest for a in parts],
        "shapes": {name: list(shape) for name, shape in shapes.items()},
    }
    _layout(version, [Manifest.from_payload(a.manifest) for a in parts], shapes)
    return Announcement(version, manifest, served_from([a.address for a in parts]))


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
    _layout(plan.version, manifests, shapes)
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
    parts: Sequence[Mapping[str, torch.Tensor]], shapes: WholeShapes
) -> dict[str, torch.Tensor]:
    """Each tensor whole, its rows taken from the parts in order (a part without it holds
    none of its rows): new tensors, which outlive the parts' buffers."""
    whole = {}
    for name, shape in shapes.items():
        pieces = [part[name] for part in parts if name in part]
        # Rows along dimension 0, in rank order; a scalar is in one part only.
        whole[name] = torch.cat(pieces).reshape(shape) if shape else pieces[0].clone()
    return whole


Rows = Mapping[str, range]  # of each tensor, the rows of the whole (dimension 0)


def rows_of_parts(plans: Sequence[WeightsPlan]) -> list[dict[str, range]]:
    """For each part (``part_plans``' plans, in order), the rows of the whole each of its
    tensors holds; a scalar is row 0 of the part that holds it."""
    taken: dict[str, int] = {}
    out = []
    for plan in plans:
        rows = {}
        for spec in Manifest.from_payload(plan.manifest, version=plan.version).tensors:
            first = taken.get(spec.name, 0)
            count = spec.shape[0] if spec.shape else 1
            rows[spec.name] = range(first, first + count)
            taken[spec.name] = first + count
        out.append(rows)
    return out


def parts_for(wanted: Rows, held: Sequence[Rows]) -> list[int]:
    """The parts (indices into ``held``, from :func:`rows_of_parts`) holding any of the
    ``wanted`` rows."""
    return [
        index
        for index, rows in enumerate(held)
        if any(_overlap(rows.get(name, range(0)), want) for name, want in wanted.items())
    ]


def rows_from(
    parts: Mapping[int, Mapping[str, torch.Tensor]], held: Sequence[Rows], name: str, want: range
) -> torch.Tensor:
    """Rows ``want`` of tensor ``name``, taken from ``parts`` (index -> that part's
    tensors: at least the :func:`parts_for` those rows) in order. KeyError if a part
    holding some of them is not given."""
    pieces = []
    for index, rows in enumerate(held):
        part = rows.get(name, range(0))
        overlap = _overlap(part, want)
        if overlap:
            tensor = parts[index][name]
            if tensor.dim() == 0:
                return tensor
            pieces.append(tensor[overlap.start - part.start : overlap.stop - part.start])
    if not pieces:
        raise ValueError(f"no part holds rows {want.start}-{want.stop} of {name!r}")
    return torch.cat(pieces) if len(pieces) != 1 else pieces[0]


def _overlap(a: range, b: range) -> range:
    return range(max(a.start, b.start), max(max(a.start, b.start), min(a.stop, b.stop)))


@dataclass(frozen=True)
class _Rows:
    dtype: str
    rows: int
    rest: tuple[int, ...]


def _layout(version: int, manifests: Sequence[Manifest], shapes: WholeShapes) -> None:
    """ManifestError unless the parts' tensors make each whole tensor: the same names, one
    dtype each, the same dimensions past the first, and rows adding up to the whole's."""
    seen: dict[str, list[_Rows]] = {}
    for manifest in manifests:
        if manifest.version != version:
            raise ManifestError(f"a part of version {manifest.version} in version {version}")
        for spec in manifest.tensors:
            rows = spec.shape[0] if spec.shape else 1
            seen.setdefault(spec.name, []).append(_Rows(spec.dtype, rows, spec.shape[1:]))
    if seen.keys() != set(shapes):
        odd = sorted(seen.keys() ^ set(shapes))[:3]
        raise ManifestError(f"version {version}: the parts and the whole name other tensors: {odd}")
    for name, pieces in seen.items():
        shape = tuple(shapes[name])
        whole_rows, rest = (shape[0], shape[1:]) if shape else (1, ())
        if len({p.dtype for p in pieces}) != 1 or any(p.rest != rest for p in pieces):
            raise ManifestError(f"version {version}: the parts of {name!r} are not of one shape")
        if sum(p.rows for p in pieces) != whole_rows:
            raise ManifestError(
                f"version {version}: the parts of {name!r} hold "
                f"{sum(p.rows for p in pieces)} rows of {whole_rows}"
            )
