"""A generator's receiver for ``ucx`` with ``weights.map_on_host``: map what was staged on
this host, fetch the rest over UCX.

A UCX trainer with ``map_on_host`` stages into slot files and names the file in each
announcement. A generator on the same host maps that file (no copy, the bytes checked
once per host; see :mod:`.shm`); a generator elsewhere fetches the version over UCX and
may relay it. A generator that maps holds no copy of its own to serve, so from then on
it offers no relay address; should it be asked anyway (planned as a relay before its
first map), its UCX server answers that it holds no such version, and the asker is
given another source.

The two paths can overlap for a moment when a trainer comes back on another host: only
versions newer than the last one handed over are ever handed over.
"""

from __future__ import annotations

from .base import NeedsPlan, Received, WeightsPlan
from .shm import ShmReceiver
from .shm.slot_file import host_identity
from .shm.strategy import mappable, where_mapped
from .ucx import UcxReceiver

__all__ = ["HostAwareReceiver"]


class HostAwareReceiver:
    def __init__(self, ucx: UcxReceiver, shm: ShmReceiver) -> None:
        self.ucx, self.shm = ucx, shm
        self._host = host_identity()
        self._maps = False  # whether the last plan was mapped
        self._handed = -1  # the newest version handed over
        self._mapped_versions: set[int] = set()

    @property
    def address(self) -> bytes:
        return b"" if self._maps else self.ucx.address

    @property
    def target(self) -> int | None:
        mapping = self.shm.target
        return mapping if mapping is not None else self.ucx.target

    def want(self, plan: WeightsPlan) -> None:
        self._maps = mappable(plan) and where_mapped(plan)[0] == self._host
        (self.shm if self._maps else self.ucx).want(plan)

    def poll(self) -> Received | NeedsPlan | None:
        outcomes = []
        for mapped, receiver in ((True, self.shm), (False, self.ucx)):
            outcome = receiver.poll()
            if outcome is not None and outcome.version > self._handed:
                outcomes.append((outcome.version, isinstance(outcome, Received), mapped, outcome))
        if not outcomes:
            return None
        # Both at once only when the paths overlapped: the newest wins, a version over a
        # request for a plan; the other is dropped (it is older, or the same version).
        _, is_version, mapped, newest = max(outcomes, key=lambda o: o[:2])
        if is_version:
            self._handed = newest.version
            if mapped:
                self._mapped_versions.add(newest.version)
        return newest

    def loaded(self, received: Received) -> None:
        self.shm.loaded(received)  # lets go of every mapped version older than this one
        if received.version in self._mapped_versions:
            self._mapped_versions = {v for v in self._mapped_versions if v > received.version}
        else:
            self.ucx.loaded(received)

    def close(self) -> None:
        self.shm.close()
        self.ucx.close()
