"""The version commands that ``SchedulerCore`` hands on: a trainer or critic publishes a
version, a worker reports the one it loaded, and a trainer whose state is behind the step
count rolls training back to it."""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import Gate, Pipeline

from . import journal_records as r
from .effects import Accepted, Rejected
from .transitions import CoreState

__all__ = ["VersionCommands"]


class VersionCommands:
    """Checks a version command against the state; commits its record, or refuses it."""

    def __init__(
        self,
        state: CoreState,
        pipeline: Pipeline,
        commit: Callable[[r.Record], None],
        reject: Callable[[Reason, str], Rejected],
    ) -> None:
        self.state = state
        self.pipeline = pipeline
        self._commit = commit
        self._reject = reject

    def publish_version(self, worker: str, version: int) -> Accepted | Rejected:
        """The trainer (or the critic) made ``version``'s weights available to the workers
        that load them."""
        publishers = [s.role for s in self.pipeline.stages if s.gate.batched]
        known = self.state.workers.get(worker)
        if known is None:  # e.g. declared lost while it started: it registers again
            return self._reject(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        if known.role not in publishers:
            return self._reject(
                Reason.WRONG_ROLE, f"only a {' or '.join(publishers)} worker publishes versions"
            )
        s = self.state
        critic = known.role != self.pipeline.gated(Gate.STEP).role
        published, done = (
            (s.critic_version, s.critic_steps_done) if critic else (s.policy_version, s.steps_done)
        )
        if not published < version <= done:
            return self._reject(
                Reason.BAD_VERSION, f"version {version} outside ({published}, {done}]"
            )
        self._commit(r.Published(version, critic))
        return Accepted()

    def rewind(self, worker: str, step: int) -> Accepted | Rejected:
        """The trainer's state (or the critic's: the worker's role says which) is at
        ``step``, behind its step count (its host was lost and only an older checkpoint
        survived): roll back exactly to it (the ``RolledBack`` rule in transitions.py)."""
        learners = [s.role for s in self.pipeline.stages if s.gate.batched]
        known = self.state.workers.get(worker)
        if known is None:
            return self._reject(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        if known.role not in learners:
            which = " or ".join(learners)
            return self._reject(Reason.WRONG_ROLE, f"only a {which} worker rolls training back")
        s = self.state
        critic = known.role != self.pipeline.gated(Gate.STEP).role
        done = s.critic_steps_done if critic else s.steps_done
        if not 0 <= step < done:
            return self._reject(
                Reason.BAD_VERSION, f"step {step} is not behind the step count {done}"
            )
        if not critic and step < s.durable_step:
            return self._reject(
                Reason.BAD_VERSION,
                f"step {s.durable_step} was reported durable and the groups trained up to it "
                f"are no longer kept; resume from a checkpoint at step {s.durable_step} or later",
            )
        if any(lease.role == known.role and lease.worker != worker for lease in s.leases.values()):
            who = "critic" if critic else "trainer"
            return self._reject(Reason.BAD_REQUEST, f"another {who} holds a step in flight")
        which = "the critic" if critic else "training"
        reason = f"{which} rolled back from step {done} to {step}"
        self._commit(r.RolledBack(step, reason, critic))
        return Accepted()

    def loaded_version(self, worker: str, version: int) -> Accepted | Rejected:
        known = self.state.workers.get(worker)
        if known is None:
            return self._reject(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        floor = -1 if known.loaded is None else known.loaded
        s = self.state
        newest = s.critic_version if known.role in s.critic_followers else s.policy_version
        if not floor <= version <= newest:
            allowed = f"[{max(floor, 0)}, {newest}]"
            return self._reject(Reason.BAD_VERSION, f"loaded version {version} outside {allowed}")
        if version != known.loaded:
            self._commit(r.Loaded(worker, version))
        return Accepted()
