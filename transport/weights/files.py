"""Weights through files: ``weights/v00000012.safetensors``, written whole, renamed in place.

For tests and for machines that share a filesystem but no UCX fabric. A reader never sees
half a file: the writer renames a finished, fsynced file into place. The newest ``keep``
versions stay; a plan for a pruned one reports its source failed, and the scheduler names
a newer version (generators may skip versions).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .base import Announcement, NeedsPlan, Received, WeightsPlan

__all__ = ["FilePublisher", "FileReceiver"]


def _path(directory: Path, version: int) -> Path:
    return directory / f"v{version:08d}.safetensors"


class FilePublisher:
    def __init__(self, directory: Path, keep: int = 4) -> None:
        if keep < 2:
            raise ValueError(f"keep={keep}: a reader needs the version before the newest")
        self.directory = directory
        self.keep = keep
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # What a publisher killed while it wrote a version left: a run has one at a time.
        for partial in directory.glob(".v*.safetensors.*.tmp"):
            partial.unlink(missing_ok=True)

    def prepare(self, state: Mapping[str, torch.Tensor]) -> None:
        """Nothing to make ahead: every version is a new file."""

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> Announcement:
        target = _path(self.directory, version)
        staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tensors = {name: t.detach().contiguous() for name, t in state.items()}
        save_file(tensors, str(staging), metadata={"version": str(version)})
        with open(staging, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(staging, target)
        self._prune(version)
        return Announcement(version, {"file": target.name})

    def close(self) -> None:
        pass

    def _prune(self, newest: int) -> None:
        for path in self.directory.glob("v*.safetensors"):
            try:
                version = int(path.stem[1:])
            except ValueError:
                continue
            if version <= newest - self.keep:
                path.unlink(missing_ok=True)


class FileReceiver:
    """Reads a version's file when asked; ``poll`` reports it (no background work)."""

    address = b""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.loaded_version: int | None = None
        self._outcome: Received | NeedsPlan | None = None

    @property
    def target(self) -> int | None:
        return None

    def want(self, plan: WeightsPlan) -> None:
        if self.loaded_version is not None and plan.version <= self.loaded_version:
            return
        started = time.perf_counter()
        try:
            state = load_file(str(_path(self.directory, plan.version)))
        except (FileNotFoundError, SafetensorError) as error:
            self._outcome = NeedsPlan(plan.version, plan.source, f"file unreadable: {error}")
            return
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        seconds = time.perf_counter() - started
        self._outcome = Received(plan.version, state, nbytes, seconds, plan.source)

    def poll(self) -> Received | NeedsPlan | None:
        outcome, self._outcome = self._outcome, None
        return outcome

    def loaded(self, received: Received) -> None:
        self.loaded_version = received.version

    def close(self) -> None:
        pass
