"""Writing rollout dumps (``run.dump_rollouts``): a group's samples as JSON lines.

The trainer writes each step's samples after the step and before its completion goes out
(:meth:`RolloutDump.trained`), so every step the scheduler counts has its lines; the
reward role writes the samples of each group it filters out (:meth:`RolloutDump.filtered`).
Where the files are, how a line is appended whole and how repeats are read is
:mod:`asyncrl.runtime.contract.rollout_dumps`; the line format, field by field, is in the
docs (guides/rollout-dumps.md).

One line per sequence (``row``) of a group: for single-turn groups that is one line per
response; a multi-turn trajectory split into several sequences has a line for each, with
the same ``trajectory``, reward and parts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from asyncrl.runtime.contract.config import AlgorithmSection, RunConfig
from asyncrl.runtime.contract.rollout_dumps import (
    FORMAT_VERSION,
    append_lines,
    filtered_file,
    steps_file,
)
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport import protocol as p

from .payloads import RewardsOut, RolloutsOut
from .policy.directories import model_dir
from .policy.tokenizer import TextCodec

__all__ = ["TOKEN_LEVEL_ESTIMATORS", "RolloutDump"]

log = structlog.get_logger("asyncrl.rollout_dump")

# Estimators whose advantage differs from token to token: a line gives the mean over the
# sequence's trained tokens ("token_mean"); the others give each token its sequence's.
TOKEN_LEVEL_ESTIMATORS = frozenset({"gae", "reinforce_pp", "reinforce_pp_baseline"})


class RolloutDump:
    """One process's writer of rollout dumps; does nothing when ``run.dump_rollouts`` is off,
    so a role calls it unconditionally."""

    def __init__(self, cfg: RunConfig, writer: str, *, enabled: bool) -> None:
        self.enabled = enabled
        self.writer = writer
        self.directory = RunDir.of(cfg).rollouts
        self.started = time.time_ns()  # orders this process's lines against a restart's
        self._model = cfg.model.path
        self._codec: TextCodec | None = None

    @classmethod
    def of(cls, cfg: RunConfig, writer: str) -> RolloutDump:
        """The writer for the process named ``writer`` (its worker id)."""
        return cls(cfg, writer, enabled=cfg.run.dump_rollouts)

    @property
    def codec(self) -> TextCodec:
        if self._codec is None:  # loaded on the first line: a run that dumps nothing never
            self._codec = TextCodec.from_dir(model_dir(self._model))
        return self._codec

    # --- the trainer's -------------------------------------------------------------------

    def trained(
        self,
        step: int,
        resumed_at: int,
        items: Sequence[p.Item],
        algorithm: AlgorithmSection,
        values: Sequence[np.ndarray] | None = None,
    ) -> int:
        """Append train step ``step``'s samples (the groups of its lease, ``items``), with
        their advantages under ``algorithm`` as the step computed them; ``resumed_at``: the
        step this trainer process took up. Returns the bytes written."""
        if not self.enabled or not items:
            return 0
        # Imported here: torch, which the reward role's writer never needs.
        from .training.step_advantages import step_advantages

        rollouts = [RolloutsOut.of(item) for item in items]
        rewards = [RewardsOut.of(item) for item in items]
        advantages, _ = step_advantages(rollouts, [r.rewards for r in rewards], algorithm, values)
        per = "token_mean" if algorithm.estimator in TOKEN_LEVEL_ESTIMATORS else "sequence"
        now = time.time()
        lines: list[dict[str, Any]] = []
        for item, rollout, reward, advantage in zip(
            items, rollouts, rewards, advantages, strict=True
        ):
            mask = rollout.trained_mask()
            for line in self._group_lines(item, rollout, reward):
                chosen = advantage[line["row"]][mask[line["row"]]]
                line.update(
                    step=step,
                    advantage=_number(chosen.mean()) if chosen.size else 0.0,
                    advantage_per=per,
                    trainer_start=self.started,
                    resumed_at=resumed_at,
                    time=now,
                )
                lines.append(line)
        return self._append(steps_file(self.directory, step), lines)

    # --- the reward role's ---------------------------------------------------------------

    def filtered(
        self, item: p.Item, rollouts: RolloutsOut, rewards: RewardsOut, reason: str
    ) -> int:
        """Append the samples of a group filtered out for ``reason``; the bytes written."""
        if not self.enabled:
            return 0
        lines = self._group_lines(item, rollouts, rewards, kind="filtered")
        now = time.time()
        for line in lines:
            line.update(filtered=reason, writer=self.writer, time=now)
        return self._append(filtered_file(self.directory, self.writer), lines)

    def _append(self, path: Path, lines: list[dict[str, Any]]) -> int:
        # A dump is for reading, not for training: a full disk (or a number JSON cannot
        # hold) costs its lines, logged, and the step or the group goes on.
        try:
            return append_lines(path, lines)
        except (OSError, ValueError) as error:
            log.warning("rollout dump lines not written", path=str(path), error=str(error))
            return 0

    # --- a group's lines -----------------------------------------------------------------

    def _group_lines(
        self, item: p.Item, rollouts: RolloutsOut, rewards: RewardsOut, kind: str = "trained"
    ) -> list[dict[str, Any]]:
        """One line per sequence of the group, without what only the trainer knows."""
        codec = self.codec
        prompt_ids = rollouts.prompt_ids.tolist()
        prompt = codec.decode(prompt_ids)
        parts = rewards.parts
        mask = rollouts.trained_mask()
        lines = []
        for row, response_ids in enumerate(rollouts.responses()):
            trajectory = int(rollouts.owners[row])
            used = rollouts.versions[row][mask[row]]
            lines.append(
                {
                    "v": FORMAT_VERSION,
                    "kind": kind,
                    "gid": item.gid,
                    "key": item.key,
                    "row": row,
                    "trajectory": trajectory,
                    "prompt": prompt,
                    "response": codec.decode(response_ids),
                    "prompt_ids": prompt_ids,
                    "response_ids": response_ids,
                    "model_tokens": int(mask[row].sum()),
                    "reward": _number(rewards.rewards[trajectory]),
                    "reward_parts": {
                        name: _number(values[trajectory]) for name, values in parts.items()
                    },
                    "versions": [int(used.min()), int(used.max())] if used.size else None,
                    "truncated": bool(rollouts.truncated[row]),
                }
            )
        return lines


def _number(value: np.floating) -> float:
    """A float32 as the shortest decimal that reads back as it (0.1, not 0.10000000149)."""
    return float(str(np.float32(value)))
