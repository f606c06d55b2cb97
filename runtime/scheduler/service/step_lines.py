"""The line of metrics.jsonl that each train step writes: what the trainer reported, where
each role's time went (activity.py), the step's critical path (step_path.py), the newest
reports (reports.py) and the group counts, with dynamic sampling's (core/status.py's
``filtering``: groups filtered, their fraction of those judged, prompts per trained batch,
all counted from the start of the run); and, after the last step, the run's end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from asyncrl.runtime.contract.bus import ACTIVITY_KEY
from asyncrl.runtime.contract.stages import GroupState
from asyncrl.runtime.scheduler.core.status import filtering
from asyncrl.runtime.scheduler.core.transitions import CoreState
from asyncrl.transport import protocol as p
from asyncrl.transport.topics import Topic, topic

from .activity import RoleActivity
from .metrics import MetricsLog
from .reports import ReportLog, step_fields
from .run_progress import RunProgress
from .step_path import StepPath
from .trace import Trace

__all__ = ["StepLines"]

log = structlog.get_logger("asyncrl.scheduler")

# The trainer's fields of the gap between generator and trainer log-probs (the status shows
# the newest step's).
MISMATCH_PREFIX = "logprob_mismatch_"
# What the corrections of the behaviour sampling did per part (algorithm.correction), which
# the status shows beside the gap.
CORRECTION_PREFIXES = ("offpolicy_", "engine_")
# The trainer's fields of how the policy learns that the status shows of the newest step.
LEARNING_KEYS = ("reward_mean", "entropy", "lr")


class StepLines:
    """Writes each train step's line, given what goes into it and where it goes."""

    def __init__(
        self,
        state: CoreState,
        progress: RunProgress,
        path: StepPath,
        activity: RoleActivity,
        reports: Mapping[str, ReportLog],
        metrics: MetricsLog,
        trace: Trace,
        emit: Callable[[str, dict[str, Any]], None],
        filter_bound: int = 0,  # dynamic sampling's bound; 0: filtering is off
    ) -> None:
        self.state = state
        self.progress = progress
        self.path = path
        self.activity = activity
        self.reports = reports
        self.metrics = metrics
        self.trace = trace
        self.emit = emit
        self.filter_bound = filter_bound

    def critic_stepped(self, m: p.Complete) -> None:
        """The critic's step goes into the next policy step's line."""
        metrics = {k: v for k, v in (m.metrics or {}).items() if k != ACTIVITY_KEY}
        self.progress.critic_step = {"critic_step": self.state.critic_steps_done, **metrics}

    def stepped(self, m: p.Complete, worker: str, gids: list[int], now: float) -> None:
        """A train step completed: its line, its events, and the drain after the last."""
        state, progress = self.state, self.progress
        progress.stepped(now)
        path = self.path.trained(state.steps_done, m.lease_id, gids, now)
        line = {
            "step": state.steps_done,
            "elapsed_s": round(now - progress.started_at, 3),
            "policy_version": state.policy_version,
            "worker": worker,
            **{k: v for k, v in (m.metrics or {}).items() if k != ACTIVITY_KEY},
            **progress.critic_step,
            **({"critic_version": state.critic_version} if state.critic_followers else {}),
            **step_fields(self.reports),
            "roles": self.activity.rates(now, self._workers_per_role()),
            "critical_path": path,
            "payloads_regenerated": sum(state.regenerated.values()),
            # every group made, in one state each (superseded: trained by a step a rollback
            # lost)
            "group_states": {s.value: state.counts[s] for s in GroupState if state.counts[s]},
            "groups_created": state.next_gid,
        }
        if self.filter_bound or state.counts[GroupState.FILTERED]:
            counts = filtering(state, self.filter_bound)
            del counts["filtered_bound"]  # the configuration's, not the step's
            line.update(counts)
        mismatch = {
            k: v for k, v in line.items() if k.startswith((MISMATCH_PREFIX, *CORRECTION_PREFIXES))
        }
        if mismatch:
            progress.mismatch = {"step": state.steps_done, **mismatch}
        learning = {k: line[k] for k in LEARNING_KEYS if k in line}
        if learning:
            progress.learning = {"step": state.steps_done, **learning}
        reached = self.path.take_reached()  # earlier steps' versions, now run by every generator
        if reached:
            line["versions_loaded"] = reached
        self.metrics.append(line)
        self.trace.step(state.steps_done, worker, now)
        self.emit(topic(Topic.METRICS, "step"), {"step": state.steps_done})
        if progress.finished(state.steps_done):
            log.info("run finished", steps=state.steps_done)
            self.emit(topic(Topic.RUN, "finished"), {"steps": state.steps_done})
            progress.draining = p.RUN_FINISHED

    def _workers_per_role(self) -> dict[str, int]:
        return dict(Counter(w.role for w in self.state.workers.values()))
