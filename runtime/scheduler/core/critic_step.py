"""The critic's step and its staleness bound: what ``SchedulerCore`` grants on a claim of
the critic's step and of the stage that reads the critic (its ``values``).

A PPO pipeline (``Pipeline.with_critic``) trains a critic beside the policy: the ``values``
stage scores each group with the critic version its worker holds, and the critic's step
takes one batch at a time, in train-by order, counting its own steps and versions. Its
staleness is bounded by the policy's rule: the critic step from version ``c`` uses values
made with a version no older than ``c - max_staleness``; older ones are made again.

The critic takes a whole batch when one is ready; fewer only when the train step waits
and they let it go: a group that went back for a lost payload, or one more urgent than the
critic's last batch, must still reach the train step, which reads what the critic has
trained. Never fewer merely because the train step is idle: each short step costs an
update of its own and a critic version that makes the values of groups in flight older,
so an asynchronous run's critic took half as many steps again as the policy (231 for 150)
and made values again for nothing. Nor while a group the train step must take is still
upstream: the short step would be followed by another for that group alone (a one-layer
critic, quick enough to catch every group as it came, took 210 steps for 150; 164 since).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from asyncrl.runtime.contract.stages import Gate, Pipeline, Stage

from . import journal_records as r
from .settings import CoreSettings
from .staleness import step_keeps_promises
from .transitions import CoreState

__all__ = ["CriticStep"]


class CriticStep:
    """The critic step's rules, given the state they read, the core's commit and the train
    step's readiness (a short batch only to complete a batch the train step waits for)."""

    def __init__(
        self,
        state: CoreState,
        settings: CoreSettings,
        pipeline: Pipeline,
        commit: Callable[[r.Record], None],
        step_ready: Callable[[Stage], bool],
    ) -> None:
        self.state = state
        self.settings = settings
        self._train = pipeline.gated(Gate.STEP)
        self._commit = commit
        self._step_ready = step_ready

    def oldest_allowed(self) -> int:
        """The staleness bound, as for the policy: the next critic step (from version
        ``critic_steps_done``) uses values at most ``max_staleness`` versions older."""
        return self.state.critic_steps_done - self.settings.max_staleness

    def batch(self, stage: Stage) -> int:
        """How many groups the critic's step takes now (0: none); one step at a time."""
        s, batch = self.state, self.settings.train_batch_groups
        if s.indexes.by_role[stage.role]:
            return 0
        ready = s.counts[stage.source]
        if ready >= batch:
            return batch
        train = self._train
        completes = s.counts[train.source] + ready >= batch  # with what it trained before
        train_waits = not s.indexes.by_role[train.role] and not self._step_ready(train)
        if not (completes and train_waits):
            return 0
        # Only when the train step could then go: while a group it must take is still
        # upstream, a short step now is followed by another one for that group alone.
        after = s.due_ready + Counter(self._ready_train_by(stage))
        return ready if step_keeps_promises(s.due, after, s.steps_done, batch) else 0

    def _ready_train_by(self, stage: Stage) -> list[int]:
        """The train-by steps of the groups waiting for the critic's step."""
        s = self.state
        gids = {gid for _, gid in s.available(stage)}
        return [
            group.train_by
            for gid in gids
            if (group := s.groups.get(gid)) is not None
            and group.state == stage.source
            and group.train_by is not None
        ]

    def redo_stale_values(self, stage: Stage) -> None:
        """Values made with a critic version the bound no longer allows are made again."""
        oldest, s = self.oldest_allowed(), self.state
        stale = sorted(
            {
                gid
                for _, gid in s.available(stage)
                if (group := s.groups.get(gid)) is not None
                and group.state == stage.source
                and group.critic_version is not None
                and group.critic_version < oldest
            }
        )
        if stale:
            (values,) = s.critic_followers
            reason = f"{values}: made with a critic older than version {oldest}"
            self._commit(r.Redone(stale, str(values), reason))
