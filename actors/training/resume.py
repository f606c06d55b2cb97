"""Which state a starting trainer (or critic) rank takes up, and taking it up.

The candidates: the rank's staged states (at most two, :mod:`.staged_state`), the
checkpoints on disk, and the base model (step 0). The target is the scheduler's step
count. The exact step wins if any candidate has it (a staged state before a checkpoint:
same bytes, read from memory); otherwise the newest candidate below the target, and the
scheduler must roll back to it. A candidate above the target (staged by a trainer killed
before its step was counted) is never taken.

In a group every rank must take up the same step from the same kind of source: a step
counts as staged only if every rank staged it whole, so one rank's missing or torn slot
sends the whole group to the same older state, never to a mix.
"""

from __future__ import annotations

import enum
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ..policy.collectives import all_gather_data
from ..policy.lora import read_adapters
from .learner_state import LearnerState
from .staged_state import StagedState

__all__ = [
    "TRAINER_STATE",
    "Choice",
    "Source",
    "choose",
    "reserve",
    "restore",
    "resume_files",
    "stage",
]

TRAINER_STATE = "trainer_state.pt"  # beside a checkpoint's weights: optimizer, RNG, step
_RNG = "rng/torch"
_CUDA_RNG = "rng/cuda"


class Source(enum.StrEnum):
    STAGED = "staged"
    CHECKPOINT = "checkpoint"
    BASE = "base model"


@dataclass(frozen=True, slots=True)
class Choice:
    step: int
    source: Source
    checksum: int | None = None  # a staged state's: the one logged when it was staged


def choose(target: int, staged: Iterable[int], checkpoints: Iterable[int]) -> Choice:
    """The state to resume from for the scheduler's count ``target`` (see the module)."""
    kept = {s for s in staged if 0 < s <= target}
    saved = {s for s in checkpoints if 0 < s <= target}
    best = max(kept | saved | {0})
    if best in kept:
        return Choice(best, Source.STAGED)
    if best in saved:
        return Choice(best, Source.CHECKPOINT)
    return Choice(0, Source.BASE)


def stage(learner: LearnerState, store: StagedState, step: int) -> int:
    """Stage this rank's state after ``step`` (its shard, the optimizer's, the RNG); its
    checksum."""
    return store.save(step, _with_rng(learner, learner.local_state()))


def reserve(learner: LearnerState, store: StagedState) -> None:
    """Size the staging files before the first step, so a lack of room stops the trainer
    at start with how much it needs. Before its first step AdamW has no state yet: its
    two moments per parameter it updates are counted as the parameter's shape."""
    state = learner.local_state()
    if not any(key.startswith("adam/") for key in state):
        for key, param in list(state.items()):
            name = key.removeprefix("param/")
            if name not in learner.optimized:
                continue  # another rank's optimizer keeps its moments
            for moment in ("exp_avg", "exp_avg_sq"):
                state[f"adam/{name}/{moment}"] = param
            state[f"adam/{name}/step"] = torch.zeros(())
    store.reserve(_with_rng(learner, state))


def _with_rng(learner: LearnerState, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state[_RNG] = torch.get_rng_state()
    if learner.device.type == "cuda":
        state[_CUDA_RNG] = torch.cuda.get_rng_state(learner.device)
    return state


def restore(
    learner: LearnerState,
    store: StagedState,
    checkpoints: Mapping[int, Path],
    target: int,
    ranks: int = 1,
) -> Choice:
    """Take up the state :func:`choose` picks for ``target`` on this rank, and say which.

    ``learner`` must still hold the base model. With ``ranks`` > 1 a collective: every
    rank of the group calls it with the same target and they take up the same step.
    ``checkpoints``: this learner's checkpoint directories (the trainer's, or the
    critic's own), by step.
    """
    staged = store.staged()
    common = _on_every_rank(set(staged), ranks)
    choice = choose(target, common, checkpoints)
    if choice.source is Source.STAGED:
        found = staged[choice.step]
        state = found.tensors()
        learner.load_local_state({k: t for k, t in state.items() if not k.startswith("rng/")})
        torch.set_rng_state(state[_RNG].clone())
        if _CUDA_RNG in state and learner.device.type == "cuda":
            torch.cuda.set_rng_state(state[_CUDA_RNG].clone(), learner.device)
        # Read back what was taken up: the same bytes as staged, or no resuming on it.
        if not found.matches(_with_rng(learner, learner.local_state())):
            raise RuntimeError(
                f"the state taken up differs from the one staged at step {found.step}"
            )
        store.at(found)
        choice = Choice(choice.step, choice.source, found.checksum)
    elif choice.source is Source.CHECKPOINT:
        _from_checkpoint(learner, checkpoints[choice.step])
        store.at(None)
    else:
        store.at(None)
    return choice


def resume_files(step: int, optimizer: dict[str, Any], counters: dict) -> dict[str, bytes]:
    """What a checkpoint keeps beside its weights to resume from: the optimizer's state,
    the RNG and the step (:data:`TRAINER_STATE`), and the counters (``counters.json``)."""
    buffer = io.BytesIO()
    state = {"step": step, "optimizer": optimizer, "torch_rng": torch.get_rng_state()}
    torch.save(state, buffer)
    return {TRAINER_STATE: buffer.getvalue(), "counters.json": json.dumps(counters).encode()}


def _from_checkpoint(learner: LearnerState, path: Path) -> None:
    whole = None
    if learner.rank == 0:  # a LoRA run's checkpoints hold its adapters alone
        whole = read_adapters(path) if learner.lora else load_file(str(path / "model.safetensors"))
    learner.load_full_weights(whole)
    state = torch.load(path / TRAINER_STATE, weights_only=True)
    learner.load_optimizer_state(state["optimizer"])  # every rank reads it whole
    torch.set_rng_state(state["torch_rng"])


def _on_every_rank(steps: set[int], ranks: int) -> set[int]:
    """The steps every rank of the group staged whole (a collective with ``ranks`` > 1)."""
    if ranks == 1:
        return steps
    common = set(steps)
    for theirs in all_gather_data(sorted(steps)):
        if not (isinstance(theirs, list) and all(type(step) is int for step in theirs)):
            raise ValueError(f"a rank's staged steps are not step counts: {str(theirs)[:100]}")
        common &= set(theirs)
    return common
