"""A version published by every rank of a group, each rank its own part.

A rank of a sharded group (FSDP2) holds some rows of every parameter: along dimension 0,
in rank order, possibly none. Each rank stages and serves its part with a publisher of its
own, so no rank holds the whole model for publishing and each host sends only its own
bytes. Rank 0 announces the version as its parts (:func:`compose`): each part's
manifest and address, and each tensor's whole shape. A receiver reads the plan into one
plan per part (:func:`part_plans`), fetches them (from their ranks, in parallel), and
lays each tensor's rows into a whole one (:func:`assemble`), whatever the group's size.

Pure: no sockets, no threads. The receiver that fetches the parts is
:class:`~.parts_receiver.PartsReceiver`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..messages import WeightsPlan
from .base import Announcement
from .layout import Manifest, ManifestError

__all__ = ["PARTS", "WholeShapes", "assemble", "compose", "has_parts", "part_plans"]

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
        PARTS: [{"manifest": a.manifest, "address": a.address} for a in parts],
        "shapes": {name: list(shape) for name, shape in shapes.items()},
    }
    _layout(version, [Manifest.from_payload(a.manifest) for a in parts], shapes)
    return Announcement(version, manifest, parts[0].address)


def has_parts(manifest: object) -> bool:
    """Whether ``manifest`` announces a version in parts."""
    return isinstance(manifest, dict) and PARTS in manifest


def part_plans(plan: WeightsPlan) -> tuple[list[WeightsPlan], dict[str, tuple[int, ...]]]:
    """One plan per part of ``plan``'s version, each from the rank that holds it (named
    ``SOURCE/part-R``), and each tensor's whole shape. ManifestError, saying what is
    wrong, for a manifest whose parts do not make the whole."""
    manifest = plan.manifest
    try:
        parts = manifest[PARTS]
        shapes = {str(n): tuple(int(d) for d in s) for n, s in manifest["shapes"].items()}
        sources = [(p["manifest"], p["address"]) for p in parts]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ManifestError(f"a manifest in parts malformed: {error!r}") from None
    if not sources or not all(isinstance(address, bytes) for _, address in sources):
        raise ManifestError("a manifest in parts names no part, or an address not in bytes")
    manifests = [Manifest.from_payload(m, version=plan.version) for m, _ in sources]
    _layout(plan.version, manifests, shapes)
    plans = [
        WeightsPlan(plan.version, m, f"{plan.source}/part-{rank}", address)
        for rank, (m, address) in enumerate(sources)
    ]
    return plans, shapes


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
