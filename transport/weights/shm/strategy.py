"""The shared-memory strategy: generators on the trainer's host map its staged buffer.

The trainer stages each version (copy + CRC-32C per bucket, as for UCX) into a slot file
in RAM-backed /dev/shm. A generator maps that file read-only, checks every bucket against
the manifest the scheduler handed it, and runs its model on the mapped bytes: nothing is
copied per generator, so four generators cost about what one does. Slot files are reused
once no generator holds them; while generators hold older versions, the trainer uses
another file rather than wait (see :mod:`.slot_file` for the locking rules).

Only for generators on the trainer's host: a plan from another host is refused with a
clear error (use ``ucx`` across hosts).

Every bucket of a version is checked against the manifest before any generator runs on
it, once per host: the generators map the same pages, which nobody may write while they
hold them, so the first to check records it in the file and the others rely on that.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import threading
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import crc32c
import structlog
import torch

from .._background import Ahead, JobThread
from ..base import MAPPED, Announcement, NeedsPlan, Received, WeightsPlan
from ..layout import Manifest, Stager, plan, views
from .slot_file import (
    Gone,
    MapCache,
    MappedVersion,
    SlotFile,
    check_name,
    decode_address,
    encode_address,
    host_identity,
    new_slot_paths,
)

__all__ = ["ShmPublisher", "ShmReceiver", "mappable", "where_mapped"]

log = structlog.get_logger("asyncrl.weights")

MiB = 1 << 20
PAGE = mmap.PAGESIZE
CHECK_THREADS = 2  # CRC-32C releases the GIL: two threads check 1 GiB in about 0.06 s here


def mappable(plan_: WeightsPlan) -> bool:
    """Whether ``plan_``'s manifest names a slot file (shm, or ucx staging into files)."""
    return "file" in plan_.manifest and "shm" in plan_.manifest


def where_mapped(plan_: WeightsPlan) -> tuple[str, Path]:
    """The host and directory of a mappable plan's slot file; ValueError if malformed."""
    address = plan_.manifest["shm"]
    if not isinstance(address, bytes):
        raise ValueError(f"plan for version {plan_.version}: its shm address is not bytes")
    return decode_address(address)


class ShmPublisher:
    def __init__(self, directory: Path, *, bucket_mb: float = 64, stage_threads: int = 2) -> None:
        self.directory = directory
        self.bucket_bytes = max(1, int(bucket_mb * MiB))
        self.stager = Stager(stage_threads)
        self._paths = new_slot_paths(directory)
        self.address = encode_address(directory)
        self._files: list[SlotFile] = []
        self._newest: SlotFile | None = None
        self._prepared = Ahead()

    def prepare(self, state: Mapping[str, torch.Tensor]) -> None:
        self._prepared.start(
            "weights-prepare", lambda total: self._claim(total).abandon(), plan(state)[1]
        )

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> Announcement:
        self._prepared.wait()
        specs, total = plan(state)
        slot = self._claim(total)
        try:
            buffer = slot.begin(total)
            checksums = tuple(self.stager.stage(state, specs, buffer, self.bucket_bytes, total))
        except BaseException:
            slot.abandon()
            raise
        slot.finish(version, total)
        self._newest = slot
        manifest = Manifest(version, specs, total, self.bucket_bytes, checksums).to_payload()
        manifest.update({"file": slot.name, "shm": self.address})
        return Announcement(version, manifest, self.address)

    def close(self) -> None:
        self._prepared.wait()
        self.stager.close()
        for slot in self._files:
            slot.remove()
        self._files.clear()
        # Not empty while a generator holds a file from a trainer before this one.
        with contextlib.suppress(OSError):
            self.directory.rmdir()

    def _claim(self, nbytes: int) -> SlotFile:
        """A file to write into, locked: one nobody reads, never the newest version's."""
        for slot in self._files:
            if slot is not self._newest and slot.try_lock():
                return slot
        slot = SlotFile(next(self._paths), nbytes)
        self._files.append(slot)
        if len(self._files) == 1:
            # The second file too, now: every version after the first needs one (the newest
            # version's is never written), and made later its page allocation would land
            # in the middle of the second version's transfer.
            spare = SlotFile(next(self._paths), nbytes)
            spare.abandon()  # made locked; free for the next version
            self._files.append(spare)
        elif len(self._files) > 2:
            held = sorted(s.version for s in self._files if s.version is not None)
            log.info("weight slot files grew", files=len(self._files), held_versions=held)
        return slot


class ShmReceiver:
    """Maps the version a plan names, checks it in the background, hands it over once."""

    address = b""  # maps the trainer's file; relays nothing

    def __init__(self, *, check_threads: int = CHECK_THREADS) -> None:
        # Kept between versions, like the map thread: a version's check starts at once.
        self._checkers = ThreadPoolExecutor(check_threads, thread_name_prefix="weights-check")
        self._host = host_identity()
        self._lock = threading.Lock()
        self._target: int | None = None
        self._jobs = JobThread("weights-map")
        self._outcome: Received | NeedsPlan | None = None
        self._mapped: dict[int, MappedVersion] = {}  # checked versions, each under its lock
        self._maps = MapCache()

    @property
    def target(self) -> int | None:
        return self._target

    def want(self, plan_: WeightsPlan) -> None:
        manifest = Manifest.from_payload(plan_.manifest, version=plan_.version)
        if not mappable(plan_):
            raise ValueError(
                f"plan for version {plan_.version} names no shared-memory file: the trainer "
                f"publishes with another weights.strategy than this generator's shm"
            )
        name = check_name(plan_.manifest["file"])
        host, directory = where_mapped(plan_)
        if host != self._host:
            raise ValueError(
                f"weights.strategy=shm: version {plan_.version} is on host {host!r}, this "
                f"generator on {self._host!r}; shared memory works on one host (use ucx)"
            )
        with self._lock:
            newest = max(self._mapped, default=-1)
            if plan_.version <= newest or self._target is not None:
                return  # held already, or a check under way (the next plan comes after it)
            self._target = plan_.version
        self._jobs.submit(
            self._map_and_check,
            directory / name,
            manifest,
            plan_.source,
            on_error=lambda error: self._end(NeedsPlan(plan_.version, plan_.source, repr(error))),
        )

    def poll(self) -> Received | NeedsPlan | None:
        with self._lock:
            outcome, self._outcome = self._outcome, None
        return outcome

    def loaded(self, received: Received) -> None:
        """The model runs on ``received``: keep its file locked, let go of older ones."""
        with self._lock:
            for version in [v for v in self._mapped if v < received.version]:
                self._mapped.pop(version).release()

    def close(self) -> None:
        self._jobs.close(timeout=10)
        self._checkers.shutdown(wait=False)
        with self._lock:
            for mapped in self._mapped.values():
                mapped.release()
            self._mapped.clear()
            self._maps.clear()

    def _map_and_check(self, path: Path, manifest: Manifest, source: str) -> None:
        started = time.monotonic()
        outcome: Received | NeedsPlan
        try:
            mapped = MappedVersion(path, manifest.version, manifest.total, self._maps)
        except (Gone, OSError) as error:
            outcome = NeedsPlan(manifest.version, source, str(error))
        else:
            digest = crc32c.crc32c(struct.pack(f"<{manifest.buckets}I", *manifest.checksums))
            with mapped.checking():
                peer_checked = mapped.checked_by_a_peer(digest)
                bad = [] if peer_checked else self._bad_buckets(mapped, manifest)
                if not bad and not peer_checked:
                    mapped.record_checked(digest)
            if peer_checked:
                # Map the pages here, not in the model's first forward pass: reading a
                # byte of each page faults them in (NumPy lets go of the GIL meanwhile).
                int(mapped.buffer[::PAGE].max(initial=0))
            if bad:
                mapped.release()
                reason = f"buckets {bad[:8]} of {path.name} fail their checksums"
                log.warning("weights rejected", version=manifest.version, reason=reason)
                outcome = NeedsPlan(manifest.version, source, reason)
            else:
                with warnings.catch_warnings():
                    # A read-only map by design: the model never writes its weights, and a
                    # write would fault instead of changing every generator's copy.
                    warnings.filterwarnings("ignore", message="The given NumPy array is not")
                    state = views(mapped.buffer, manifest.tensors)
                outcome = Received(
                    manifest.version,
                    state,
                    manifest.total,
                    time.monotonic() - started,
                    MAPPED,  # not the plan's source: a failure still names that one
                )
                with self._lock:
                    self._mapped[manifest.version] = mapped
        self._end(outcome)

    def _end(self, outcome: Received | NeedsPlan) -> None:
        with self._lock:
            self._outcome, self._target = outcome, None

    def _bad_buckets(self, mapped: MappedVersion, manifest: Manifest) -> list[int]:
        view = memoryview(mapped.buffer)

        def check(index: int) -> bool:
            start, stop = manifest.bucket_range(index)
            return crc32c.crc32c(view[start:stop]) == manifest.checksums[index]

        fine = list(self._checkers.map(check, range(manifest.buckets)))
        return [index for index, ok in enumerate(fine) if not ok]
