"""Staleness admission: how many groups a generator may start without breaking the bound.

A generator that has loaded version ``L`` produces tokens of version ``L`` or newer. Train
step ``s`` updates version ``s - 1`` into ``s``, so a group trained at step ``s`` is
``s - 1 - L`` versions stale at worst. To keep that within ``max_staleness`` the group
must be trained by step ``L + max_staleness + 1``: its *train-by step* (``train_by``).

Admitting a group is a promise to train it by its train-by step, and every step takes
exactly ``batch`` groups. The promises are keepable (the trainer can keep every one taking
the earliest train-by steps first) exactly when, for every train-by step ``d``, the alive
untrained groups due by ``d`` fit in the steps left until ``d``. Admission keeps that true. The
trainer keeps it true too: it takes a step only if the groups it can take now (the ready
ones, earliest train-by step first) leave the rest keepable, and otherwise waits for the
stragglers rather than leave them behind.

With ``max_staleness = 0`` this is synchronous RL: a generator gets work only once it has
loaded the newest version, and exactly one batch is in flight per step.

Dynamic sampling (``algorithm.filter_groups``) needs nothing more: a group the reward
filters is no longer due (transitions.py's ``_filter`` forgets its promise), so the room
computed here grows by one and the next claim admits a fresh group in its place. The
lookahead is the bound itself, ``max_staleness + 1`` steps of ``batch`` groups: the
pipeline keeps that much in flight and refills every filtered slot, so each step still
takes a full batch of groups with signal. Where nothing carries signal the refilling
would go on forever; the core counts the groups filtered since the last one judged to
carry signal (``CoreState.filtered_in_a_row``) and the scheduler stops the run past
``max_filtered_batches`` batches' worth (``SchedulerCore.filter_bound_passed``). Not since
the last step: while the trainer works on a step (or writes a checkpoint) the generators
go on judging groups, and at a high filtered fraction hundreds can be filtered between two
steps of a run that learns well.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["admission_capacity", "step_keeps_promises", "train_by_step"]


def train_by_step(loaded_version: int, max_staleness: int) -> int:
    """The last train step at which work started under ``loaded_version`` may be used."""
    return loaded_version + max_staleness + 1


def admission_capacity(due: Mapping[int, int], steps_done: int, batch: int, train_by: int) -> int:
    """How many more groups with ``train_by`` fit beside the ``due`` ones (step -> count)."""
    if train_by <= steps_done:
        return 0
    due_by = sum(count for d, count in due.items() if d <= train_by)
    room = (train_by - steps_done) * batch - due_by
    for later in sorted(d for d in due if d > train_by):
        due_by += due[later]
        room = min(room, (later - steps_done) * batch - due_by)
    return max(room, 0)


def step_keeps_promises(
    due: Mapping[int, int], due_ready: Mapping[int, int], steps_done: int, batch: int
) -> bool:
    """Whether a step now, taking the ``batch`` ready groups due soonest, strands no one.

    After the step, the groups due by each train-by step ``d`` must fit in the ``d - step``
    steps left, so the step must take at least ``due_by(d) - (d - step) * batch`` of them,
    and it can take ``min(batch, ready_by(d))``.
    """
    step = steps_done + 1
    due_by = ready_by = 0
    for d in sorted(due):
        due_by += due[d]
        ready_by += due_ready.get(d, 0)
        if d >= step and min(batch, ready_by) < due_by - (d - step) * batch:
            return False
    return True
