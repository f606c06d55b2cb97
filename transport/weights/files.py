"""Weights through files: ``weights/v00000012.safetensors``, written whole, renamed in place.

A reader never sees half a file: the writer renames a finished, fsynced file into place.
The newest ``keep`` versions stay; a reader that asks for a pruned one gets None and
takes a newer version, which the scheduler allows (generators may skip versions).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .base import Fetched

__all__ = ["FileWeightSync"]


class FileWeightSync:
    def __init__(self, directory: Path, keep: int = 4) -> None:
        if keep < 2:
            raise ValueError(f"keep={keep}: a reader needs the version before the newest")
        self.directory = directory
        self.keep = keep
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, version: int) -> Path:
        return self.directory / f"v{version:08d}.safetensors"

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        target = self.path(version)
        staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tensors = {name: t.detach().contiguous() for name, t in state.items()}
        save_file(tensors, str(staging), metadata={"version": str(version)})
        with open(staging, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(staging, target)
        self._prune(version)

    def fetch(self, version: int) -> Fetched | None:
        started = time.perf_counter()
        try:
            state = load_file(str(self.path(version)))
        except (FileNotFoundError, SafetensorError):
            return None  # pruned meanwhile, or never published here
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        return Fetched(version, state, nbytes, time.perf_counter() - started)

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
