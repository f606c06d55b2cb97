"""A receiver that takes versions whole, as before, and versions in parts (parts.py).

A version whole goes to the strategy's own receiver (which may relay it). A version in
parts is fetched part by part, each by a receiver of its own from the rank that holds it,
all at once; when every part arrived whole and checked, the parts are laid into whole
tensors (their own memory: the parts' buffers are free for the next version) and handed
over as one version. A part that fails fails the version: the receiver asks for a plan
again, naming no source (the group's rank 0 announced it; a group that lost a rank
announces no newer version until it meets again, and the last one stays in force).

A receiver taking parts relays nothing: it offers no address while its last plan was in
parts (a relay would have to serve each part).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..messages import WeightsPlan
from .base import NeedsPlan, Received, WeightReceiver
from .parts import assemble, has_parts, part_plans

__all__ = ["PartsReceiver"]


class PartsReceiver:
    """``whole``: the receiver of versions whole; ``part``: makes a receiver for a part
    (one per rank, made as a version with that many parts first comes)."""

    def __init__(self, whole: WeightReceiver, part: Callable[[], WeightReceiver]) -> None:
        self.whole = whole
        self._make_part = part
        self._parts: list[WeightReceiver] = []
        self._in_parts = False  # whether the last plan was for a version in parts
        self._plan: WeightsPlan | None = None  # the version in parts being fetched
        self._count = 0  # its parts
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._got: dict[int, Received] = {}  # part -> what arrived of the version
        self._started = 0.0
        self._handed = -1  # the newest version handed over, whole or in parts
        self._from_parts = -1  # the newest version handed over from parts

    @property
    def address(self) -> bytes:
        return b"" if self._in_parts else self.whole.address

    @property
    def target(self) -> int | None:
        return self._plan.version if self._plan is not None else self.whole.target

    def want(self, plan: WeightsPlan) -> None:
        if not has_parts(plan.manifest):
            self._in_parts = False
            self.whole.want(plan)
            return
        plans, shapes = part_plans(plan)  # ManifestError: refused before anything starts
        self._in_parts = True
        if plan.version <= max(self._handed, self._plan.version if self._plan else -1):
            return  # held, or being fetched already
        while len(self._parts) < len(plans):
            self._parts.append(self._make_part())
        self._plan, self._shapes = plan, shapes
        self._count = len(plans)
        self._got, self._started = {}, time.monotonic()
        for receiver, part in zip(self._parts, plans, strict=False):
            receiver.want(part)

    def poll(self) -> Received | NeedsPlan | None:
        whole = self.whole.poll()
        # Versions whole pass as the strategy's receiver hands them, unless one from parts
        # as new was handed over since (the trainer changed how it publishes).
        if whole is not None and whole.version > self._from_parts:
            if isinstance(whole, Received):
                self._handed = max(self._handed, whole.version)
            return whole
        if self._plan is None:
            return None
        plan, count = self._plan, self._count
        for index, receiver in enumerate(self._parts[:count]):
            outcome = receiver.poll()
            if outcome is None or outcome.version != plan.version:
                continue
            if isinstance(outcome, NeedsPlan):
                self._plan = None
                reason = f"part {index} from {outcome.failed or 'its rank'}: {outcome.reason}"
                return NeedsPlan(plan.version, "", reason)
            self._got[index] = outcome
        if len(self._got) < count:
            return None
        parts = [self._got[index] for index in range(count)]
        state = assemble([part.state for part in parts], self._shapes)
        self._plan, self._got = None, {}
        self._handed = self._from_parts = plan.version
        return Received(
            plan.version,
            state,
            sum(part.nbytes for part in parts),
            time.monotonic() - self._started,
            plan.source,
            max(part.attempts for part in parts),
            sum(part.retried_buckets for part in parts),
        )

    def loaded(self, received: Received) -> None:
        # A version from parts runs on tensors of its own: no part's buffer is held.
        if received.version != self._from_parts:
            self.whole.loaded(received)

    def close(self) -> None:
        for receiver in [self.whole, *self._parts]:
            receiver.close()
