"""The critical path of each train step, on the scheduler's clock.

A step's path has four legs, each the time between two moments the scheduler sees:

    batch ready ──▶ train lease ──▶ trained ──▶ version published ──▶ loaded by every generator
      (the last group of the       (its        (the trainer's         (the last generator's
       step's batch joined          Complete)   PublishVersion)        LoadedVersion of it
       into the train stage's                                          or a newer version)
       source state)

The first two legs are known when the step completes and go into its own metrics line
(``critical_path``), with the part of the first during which the trainer was still on the
step before (``trainer_busy_s``: from the batch's readiness to the previous version's
publication, the trainer's last move before it claims again), so a batch that waited for
a busy trainer is told apart from a trainer slow to be handed its batch. The last two
legs come later, so they go into the next step line written after every generator runs
the step's version (``versions_loaded``, one entry per step, naming it). A generator may
skip versions: a step's version counts as loaded by a generator once it runs that version
or a newer one. The last step's version has no line after it, and a step whose batch
became ready before a scheduler restart has no ``ready_to_leased_s``.

Pure bookkeeping: times come in as arguments (the service's ``now``), nothing is read from
a clock, and every call does work in proportion to its own groups or steps, never to the
run's length. What is kept is bounded: a group's ready time until it leaves the train
stage's states, a train lease's grant until its step, and at most ``keep`` steps waiting
for their version to reach the generators (a run whose generators never report is not
kept forever).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from asyncrl.runtime.contract.stages import GroupState
from asyncrl.runtime.scheduler.core.effects import Transition

__all__ = ["LEGS", "TRAINER_BUSY", "StepPath"]

# Every leg's key, in path order, and the part of the first spent on the step before.
LEGS = ("ready_to_leased_s", "leased_to_trained_s", "trained_to_published_s",
        "published_to_loaded_s")  # fmt: skip
TRAINER_BUSY = "trainer_busy_s"

_DIGITS = 4  # rounding of the seconds written (a tenth of a millisecond)
_MAX_LEASES = 16  # grants kept at most (one train lease at a time is the rule)


@dataclass(slots=True)
class _Step:
    trained_at: float
    published_at: float | None = None


class StepPath:
    """When each step's batch was ready, leased, trained, published and loaded everywhere.

    ``ready`` is the state the step stage takes groups from, ``training`` its working
    state (None if it has none).
    """

    def __init__(self, ready: GroupState, training: GroupState | None, keep: int = 64) -> None:
        self.ready = ready
        self.training = training
        self.keep = keep
        self._ready_at: dict[int, float] = {}  # gid -> when it first became ready
        self._leased_at: dict[int, float] = {}  # train lease id -> when it was handed out
        self._steps: dict[int, _Step] = {}  # trained, version not yet run by every generator
        self._reached: list[dict[str, Any]] = []  # legs found since the last step line
        self._trainer_free_at: float | None = None  # the previous step's end (its publication)

    # --- what the service tells it ---------------------------------------------------

    def moved(self, transitions: Iterable[Transition], now: float) -> None:
        """Groups changed state: note when each became ready; forget those that left.

        A group that goes back to ready from training (its lease expired or failed) keeps
        the moment it first became ready: the step waited for it all along.
        """
        for t in transitions:
            if t.target is self.ready:
                for gid in t.groups:
                    self._ready_at.setdefault(gid, now)
            elif t.source in (self.ready, self.training) and t.target is not self.training:
                for gid in t.groups:  # trained, dead, or sent back upstream
                    self._ready_at.pop(gid, None)

    def leased(self, lease_id: int, now: float) -> None:
        """A train lease was handed out."""
        self._leased_at[lease_id] = now
        while len(self._leased_at) > _MAX_LEASES:  # grants that never completed
            del self._leased_at[next(iter(self._leased_at))]

    def trained(
        self, step: int, lease_id: int, gids: Iterable[int], now: float
    ) -> dict[str, float]:
        """Step ``step`` completed under ``lease_id`` with ``gids``: its first two legs."""
        legs: dict[str, float] = {}
        leased = self._leased_at.pop(lease_id, None)
        if leased is not None:
            batch = list(gids)
            ready = [self._ready_at[gid] for gid in batch if gid in self._ready_at]
            if batch and len(ready) == len(batch):
                ready_at = max(ready)
                legs["ready_to_leased_s"] = _round(leased - ready_at)
                if self._trainer_free_at is not None:
                    free_at = min(self._trainer_free_at, leased)
                    legs[TRAINER_BUSY] = _round(free_at - ready_at)
            legs["leased_to_trained_s"] = _round(now - leased)
        self._steps[step] = _Step(now)
        self._trainer_free_at = now  # until its publication says later
        while len(self._steps) > self.keep:
            del self._steps[min(self._steps)]
        return legs

    def published(self, version: int, now: float) -> None:
        """The trainer announced ``version`` (the weights after step ``version``)."""
        step = self._steps.get(version)
        if step is not None and step.published_at is None:
            step.published_at = now
            if self._trainer_free_at is not None:
                self._trainer_free_at = max(self._trainer_free_at, now)

    def loaded_everywhere(self, version: int, now: float) -> None:
        """Every generator now runs ``version`` or newer: the steps up to it are done."""
        for number in sorted(n for n in self._steps if n <= version):
            step = self._steps.pop(number)
            legs: dict[str, Any] = {"step": number}
            if step.published_at is not None:
                legs["trained_to_published_s"] = _round(step.published_at - step.trained_at)
                legs["published_to_loaded_s"] = _round(now - step.published_at)
            else:  # published before the scheduler restarted, or the announcement was lost
                legs["trained_to_loaded_s"] = _round(now - step.trained_at)
            self._reached.append(legs)

    def take_reached(self) -> list[dict[str, Any]]:
        """The later legs found since the previous call, oldest step first."""
        reached, self._reached = self._reached, []
        return reached


def _round(seconds: float) -> float:
    return round(max(0.0, seconds), _DIGITS)
