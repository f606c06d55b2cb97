"""The UCX strategy: :class:`UcxPublisher` on the trainer, :class:`UcxReceiver` on generators.

Publishing stages the state dict into one of two buffers (the other may still be read by
receivers of the previous version), checksums its buckets (and signs them, where weights
cross machines: ..mac) and returns the announcement the scheduler passes on. Receiving
runs in the background: the receiver fetches the version its plan names into its free
buffer, relays what it has checked to receivers that pull from it, and hands the version
over, whole and checked, to the caller's :meth:`UcxReceiver.poll`. The caller's model
then runs on that buffer's bytes, which is why the buffer is pinned until the next version
replaces it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import structlog
import torch

from .._background import Ahead, JobThread
from ..base import Announcement, NeedsPlan, Received, WeightsPlan
from ..buffers import SlotState
from ..layout import Manifest, Stager, plan, views
from ..mac import LOCAL_ONLY, BucketCheck, RequestKey, WeightsAccess, bucket_macs
from ..shm.staging_files import StagingFiles
from .fetch import Fetch
from .node import ProgressMode, UcxNode
from .server import Server
from .store import Store
from .wire import TagSource

__all__ = ["UcxPublisher", "UcxReceiver"]

log = structlog.get_logger("asyncrl.weights")

MiB = 1 << 20


class UcxPublisher:
    """Stages versions and serves them over UCX; with ``share_dir``, the staging buffers are
    slot files there, which generators on this host map instead of fetching them.
    ``access``: who may fetch them (..mac)."""

    def __init__(
        self,
        *,
        bucket_mb: float = 64,
        progress_mode: ProgressMode = "thread",
        send_timeout_s: float = 30.0,
        share_dir: Path | None = None,
        access: WeightsAccess = LOCAL_ONLY,
    ) -> None:
        self.bucket_bytes = max(1, int(bucket_mb * MiB))
        self.access = access
        self.files = None if share_dir is None else StagingFiles(share_dir)
        self.node = UcxNode(progress_mode, local=access.local)
        self.store = Store(self.files)
        self.server = Server(self.node, self.store, send_timeout_s, access.key)
        self.send_timeout_s = send_timeout_s
        self.address = self.node.address
        self.stager = Stager()
        self._prepared = Ahead()

    def prepare(self, state: Mapping[str, torch.Tensor]) -> None:
        self._prepared.start("weights-prepare", self._make_buffers, plan(state)[1])

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> Announcement:
        self._prepared.wait()
        specs, total = plan(state)
        # Its server cancels the reads of the slot to be written within a turn, and a send
        # ends by its own deadline: a wait past that has no end, and must say so.
        slot = self.store.claim(version, total, deadline=time.monotonic() + self.send_timeout_s)
        if slot is None:
            with self.store.changed:
                slots = self.store.slots()
            raise RuntimeError(
                f"no staging buffer came free for version {version} in "
                f"{self.send_timeout_s:g} s: {slots}"
            )
        buffer = self.store.buffers[slot]
        assert buffer is not None
        try:
            checksums = tuple(self.stager.stage(state, specs, buffer, self.bucket_bytes, total))
            macs = self._macs(buffer, total)
        except BaseException:
            with self.store.changed:
                if self.files is not None and self.store.in_file[slot]:
                    self.files.abandon(slot)
                self.store.pool.abort_write(slot)
            raise
        manifest = Manifest(version, specs, total, self.bucket_bytes, checksums, macs).to_payload()
        with self.store.changed:
            if self.files is not None and self.store.in_file[slot]:
                manifest.update(self.files.finish(slot, version, total))
            self.store.pool.verified(slot, total)
            self.store.pool.finish_write(slot)
            self.store.changed.notify_all()
        return Announcement(version, manifest, self.address)

    def close(self) -> None:
        self._prepared.wait()
        self.stager.close()
        self.server.close()
        self.node.close()
        if self.files is not None:
            self.files.close()

    def _macs(self, buffer: np.ndarray, total: int) -> bytes:
        if not self.access.signs_buckets:
            return b""
        assert self.access.key is not None
        return bucket_macs(self.access.key, buffer, total, self.bucket_bytes, self.stager)

    def _make_buffers(self, nbytes: int) -> None:
        for slot in range(len(self.store.pool)):
            with self.store.changed:
                self.store.buffer(slot, nbytes)
        if self.files is not None:
            for slot in range(len(self.store.pool)):
                self.files.abandon(slot)  # made locked for writing: nothing is in them yet


class UcxReceiver:
    def __init__(
        self,
        *,
        bucket_mb: float = 64,
        progress_mode: ProgressMode = "thread",
        stall_timeout_s: float = 10.0,
        relay: bool = True,
        access: WeightsAccess = LOCAL_ONLY,
    ) -> None:
        self.consume_bytes = max(1, int(bucket_mb * MiB))
        self.stall_timeout_s = stall_timeout_s
        self.access = access
        self.node = UcxNode(progress_mode, local=access.local)
        self.store = Store()
        self.server = Server(self.node, self.store, stall_timeout_s, access.key) if relay else None
        self._requests = RequestKey(access.key) if access.key else None
        self.address = self.node.address if relay else b""
        self._held: int | None = None  # the newest version fetched whole
        self._tags = TagSource()
        self._job: _Job | None = None
        self._fetches = JobThread("weights-fetch")
        self._outcome: Received | NeedsPlan | None = None
        self._first_plan_at: dict[int, float] = {}
        self._attempts: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def target(self) -> int | None:
        """The version being fetched, if any."""
        job = self._job
        return None if job is None or job.finished else job.version

    @property
    def checked_bytes(self) -> int:
        """Checked bytes of the version being fetched, or kept for a resumed fetch (else 0)."""
        pool = self.store.pool
        with self.store.changed:
            for index in range(len(pool)):
                state, _, _, verified, _ = pool.state(index)
                if state is SlotState.WRITING:
                    return verified
        return 0

    def want(self, plan_: WeightsPlan) -> None:
        """Fetch ``plan_``'s version from its source (in the background).

        A plan for an older version than the one held or being fetched is ignored; one
        for the version being fetched moves the fetch to the new source, keeping the
        checked bytes.
        """
        manifest = Manifest.from_payload(plan_.manifest, version=plan_.version)
        check = BucketCheck(manifest, self.access)  # ManifestError: no MACs where needed
        if self._held is not None and plan_.version <= self._held:
            return  # loaded, or whole and waiting to be polled
        current = self._job
        if current is not None and not current.finished:
            if plan_.version <= current.version:
                return  # already on it (or on a newer one)
            current.stop.set()  # a newer version: the old fetch ends after its range
        self._first_plan_at.setdefault(plan_.version, time.monotonic())
        self._attempts[plan_.version] = self._attempts.get(plan_.version, 0) + 1
        with self._lock:
            # A version fetched whole and not yet polled stays to be polled: the model must
            # take it before its slot can be written again, and the new fetch waits for that.
            if not isinstance(self._outcome, Received):
                self._outcome = None
        self._job = job = _Job(plan_.version)
        with self.store.changed:
            self.store.expecting = plan_.version
        self._fetches.submit(  # after the stopped one ends
            self._run,
            plan_,
            manifest,
            job,
            check,
            on_error=lambda error: self._broke(plan_, job, error),
        )

    def poll(self) -> Received | NeedsPlan | None:
        """What the background fetch came to, once: a version, or a request for a new source."""
        with self._lock:
            outcome, self._outcome = self._outcome, None
        return outcome

    def loaded(self, received: Received) -> None:
        """The model now runs on ``received``'s buffer: keep it until the next one."""
        with self.store.changed:
            self.store.pool.pin(received.slot)
            self.store.changed.notify_all()

    def close(self) -> None:
        if self._job is not None:
            self._job.stop.set()
        with self.store.changed:
            self.store.changed.notify_all()
        self._fetches.close(timeout=self.stall_timeout_s + 1)
        if self.server is not None:
            self.server.close()
        self.node.close()

    # --- the fetch thread ------------------------------------------------------------

    def _run(self, plan_: WeightsPlan, manifest: Manifest, job: _Job, check: BucketCheck) -> None:
        slot, resume = self._slot_for(manifest, job.stop)
        if slot is None:
            job.finished = True
            if not job.stop.is_set():
                self._no_slot(plan_)
            return
        fetch = Fetch(
            manifest,
            plan_.source,
            plan_.source_address,
            slot,
            self.node,
            self.store,
            self.consume_bytes,
            self.stall_timeout_s,
            self._tags,
            resume_from=resume,
            stop=job.stop,
            requests=self._requests,
            check=check,
        )
        if fetch.run():
            with self.store.changed:
                self.store.pool.finish_write(slot)
                self.store.changed.notify_all()
            version = manifest.version
            outcome: Received | NeedsPlan = Received(
                version,
                views(self.store.buffers[slot][: manifest.total], manifest.tensors),
                manifest.total,
                time.monotonic() - self._first_plan_at.pop(version, time.monotonic()),
                plan_.source,
                self._attempts.pop(version, 1),
                fetch.retried_buckets,
                slot,
            )
        elif job.stop.is_set():
            with self.store.changed:
                self.store.pool.abort_write(slot)
                self.store.changed.notify_all()
            job.finished = True
            return
        else:
            log.warning(
                "weight fetch lost its source",
                version=manifest.version,
                source=plan_.source,
                reason=fetch.error[:200],
                checked_bytes=fetch.verified,
            )
            outcome = NeedsPlan(manifest.version, plan_.source, fetch.error)
        job.finished = True
        with self._lock:
            if isinstance(outcome, Received):
                self._held = outcome.version
            self._outcome = outcome

    def _broke(self, plan_: WeightsPlan, job: _Job, error: Exception) -> None:
        """A fetch ended in an exception: ask for a plan again (it resumes from what was
        checked) rather than wait for an outcome that will never come."""
        job.finished = True
        with self._lock:
            self._outcome = NeedsPlan(plan_.version, plan_.source, f"fetch failed: {error!r}")

    def _no_slot(self, plan_: WeightsPlan) -> None:
        """No buffer came free for the version within the stall timeout: say so and ask
        for a plan again, rather than wait with no end (its model holds one buffer and has
        not taken the version in the other). No source failed, so none is named."""
        with self.store.changed:
            slots = self.store.slots()
        reason = f"no buffer free for version {plan_.version} in {self.stall_timeout_s:g} s"
        log.warning("weight fetch waited for a buffer", version=plan_.version, slots=slots)
        with self._lock:
            if not isinstance(self._outcome, Received):
                self._outcome = NeedsPlan(plan_.version, "", f"{reason} ({slots})")

    def _slot_for(self, manifest: Manifest, stop: threading.Event) -> tuple[int | None, int]:
        """The slot to fetch into and the checked bytes already there (a resumed fetch)."""
        pool = self.store.pool
        with self.store.changed:
            for index in range(len(pool)):
                state, version, _, verified, _ = pool.state(index)
                if state is SlotState.WRITING and version == manifest.version:
                    return index, verified
                if state is SlotState.WRITING:  # an older version's fetch that gave up
                    pool.abort_write(index)
        deadline = time.monotonic() + self.stall_timeout_s
        slot = self.store.claim(manifest.version, manifest.total, stop, deadline)
        return slot, 0


@dataclass
class _Job:
    """The version a receiver is after, and the flags its fetch thread reads and sets."""

    version: int
    stop: threading.Event = field(default_factory=threading.Event)
    finished: bool = False
