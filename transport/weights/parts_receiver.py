"""A receiver of versions in parts (parts.py), one receiver of the strategy per part.

A worker whose versions come from a group publishing from every rank knows how many parts
each version has (the group's size: the config says so). Every part is fetched at once,
each by its own receiver from the address the plan gives for it; when every part arrived
whole and checked, the parts are laid into whole tensors (their own memory) and handed
over as one version. A part that fails fails the version: the receiver asks for a plan
again, naming the plan's source, and the version before stays in force.

It relays as a receiver of versions whole does: each part's receiver serves the part it
holds, so its address is theirs, one per part (``served_from``); a receiver whose parts
do not all relay (mapped from the publisher's files, say) offers none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..messages import WeightsPlan
from .base import MAPPED, NeedsPlan, Received, WeightReceiver
from .layout import ManifestError
from .parts import assemble, part_count, part_plans, served_from, split_dims

__all__ = ["PartsReceiver"]


class PartsReceiver:
    """``parts``: a receiver for each part, in rank order."""

    def __init__(self, parts: Sequence[WeightReceiver]) -> None:
        if len(parts) < 2:
            raise ValueError(f"a version in parts has at least 2, got {len(parts)} receivers")
        self.parts = list(parts)
        self._plan: WeightsPlan | None = None  # the plan being followed (None: failed)
        self._version = -1  # the version being fetched, kept past a failed plan
        self._source = ""  # whom the last plan for it named
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._dims: dict[str, int] = {}  # each tensor's split dimension, where not 0
        self._got: dict[int, Received] = {}  # part -> what arrived of the version
        self._started = 0.0
        self._handed = -1  # the newest version handed over

    @property
    def address(self) -> bytes:
        addresses = [part.address for part in self.parts]
        return served_from(addresses) if all(addresses) else b""

    @property
    def target(self) -> int | None:
        return self._plan.version if self._plan is not None else None

    def want(self, plan: WeightsPlan) -> None:
        count = part_count(plan.manifest)
        if count != len(self.parts):
            # The config says how the group publishes; a plan otherwise was published
            # under another config (a run resumed with other settings), or is forged.
            whole = "whole" if count == 1 else f"in {count} parts"
            raise ManifestError(
                f"version {plan.version} came {whole}; this worker takes versions in "
                f"{len(self.parts)} parts (weights.from_every_rank with a group of "
                f"{len(self.parts)})"
            )
        plans, shapes = part_plans(plan)  # ManifestError: refused before anything starts
        if plan.version <= self._handed or plan.version < self._version:
            return  # held, or older than the one being fetched
        if plan.version > self._version:
            self._version, self._got, self._started = plan.version, {}, time.monotonic()
        elif self._plan is not None and self._plan.source == plan.source:
            return  # being fetched already
        self._plan, self._shapes, self._source = plan, shapes, plan.source
        self._dims = split_dims(plan.manifest)
        for index, (receiver, part) in enumerate(zip(self.parts, plans, strict=True)):
            # A part in already is not asked for again: its receiver holds that version
            # and would ignore the plan (it has nothing more to report).
            if index not in self._got:
                receiver.want(part)

    def poll(self) -> Received | NeedsPlan | None:
        failed: NeedsPlan | None = None
        for index, receiver in enumerate(self.parts):
            outcome = receiver.poll()
            if outcome is None or outcome.version != self._version:
                continue
            if isinstance(outcome, Received):
                self._got[index] = outcome
            elif self._plan is not None and failed is None:
                source = self._plan.source
                reason = f"part {index} from {outcome.failed or source}: {outcome.reason}"
                failed = NeedsPlan(self._version, source, reason)
        if len(self._got) == len(self.parts) and self._version > self._handed:
            return self._assembled()
        if failed is not None:
            self._plan = None  # until the caller has another plan; the parts in stay
        return failed

    def _assembled(self) -> Received:
        parts = [self._got[index] for index in range(len(self.parts))]
        state = assemble([part.state for part in parts], self._shapes, self._dims)
        self._plan, self._got, self._handed = None, {}, self._version
        return Received(
            self._version,
            state,
            sum(part.nbytes for part in parts),
            time.monotonic() - self._started,
            # Mapped from the ranks' files on this host: the bytes came from no worker.
            MAPPED if all(part.source == MAPPED for part in parts) else self._source,
            max(part.attempts for part in parts),
            sum(part.retried_buckets for part in parts),
        )

    def loaded(self, received: Received) -> None:
        """Nothing to keep: a version from parts runs on tensors of its own, and each
        part's receiver keeps its newest part to relay by its own rules."""

    def close(self) -> None:
        for receiver in self.parts:
            receiver.close()
