"""The critic's step and its staleness bound: what ``SchedulerCore`` grants on a claim of
the critic's step and of the stage that reads the critic (its ``values``).

A PPO pipeline (``Pipeline.with_critic``) trains a critic beside the policy: the ``values``
stage scores each group with the critic version its worker holds, and the critic's step
takes one batch at a time, in train-by order, counting its own steps and versions. Its
staleness is bounded by the policy's rule: the critic step from version ``c`` uses values
made with a version no older than ``c - max_staleness``; older ones are made again.

The critic takes a whole batch when one is ready; fewer only when the train step waits
and they complete its batch: a group that went back for a lost payload, or one more urgent
than the critic's last batch, must still reach the train step, which reads what the critic
has trained. Never fewer merely because the train step is idle: each short step costs an
update of its own and a critic version that makes the values of groups in flight older,
so an asynchronous run's critic took half as many steps again as the policy (231 for 150)
and made values again for nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.runtime.contract.stages import Gate, Pipeline, Stage

from . import journal_records as r
from .settings import CoreSettings
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
        return ready if completes and train_waits else 0

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
