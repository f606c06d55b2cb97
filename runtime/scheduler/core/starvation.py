"""Why the run makes no progress: one line for an operator, from the core's state alone.

A stalled run used to be silent: the scheduler waited for a worker that was not coming
(refused on every claim, never registered, bound by staleness) and the terminal showed
nothing. :func:`why_no_step` reads the state the way an operator would, stage by stage,
and says which role starves and for what. It is pure (no clock, no I/O): the service
calls it when no step has come for a while and logs the answer.
"""

from __future__ import annotations

from collections import Counter

from asyncrl.runtime.contract.stages import Gate, Pipeline, Stage

from .settings import CoreSettings
from .staleness import admission_capacity, step_keeps_promises, train_by_step
from .transitions import CoreState

__all__ = ["why_no_step"]


def why_no_step(state: CoreState, settings: CoreSettings, pipeline: Pipeline) -> str:
    """What each stage waits for, starting with the train step: ``"0 groups ready of 8;
    8 waiting for logp, no logp worker registered"``."""
    workers = Counter(w.role for w in state.workers.values())
    leased = Counter(lease.role for lease in state.leases.values())
    step = pipeline.gated(Gate.STEP)
    batch = settings.train_batch_groups
    ready = state.counts[step.source]
    parts = [f"{ready} groups ready of {batch}"]
    if ready >= batch:
        parts.append(_trainer(state, step, workers, leased, batch))
    for stage in pipeline.stages:
        if stage.gate is Gate.STEP:
            continue
        waiting = _waiting(state, stage)
        if waiting:
            parts.append(_stage(state, settings, stage, waiting, workers, leased))
    if not state.groups and not workers[pipeline.entry_role]:
        parts.append(f"no groups and no {pipeline.entry_role} worker registered")
    return "; ".join(parts)


def _trainer(
    state: CoreState, step: Stage, workers: Counter[str], leased: Counter[str], batch: int
) -> str:
    role = step.role
    if not workers[role]:
        return f"no {role} worker registered"
    if leased[role]:
        return f"a {role} step is in flight"
    if not step_keeps_promises(state.due, state.due_ready, state.steps_done, batch):
        return f"{role} waits: a step now would break admitted groups' staleness bound"
    return f"{role} worker registered and idle: it has not claimed"


def _stage(
    state: CoreState,
    settings: CoreSettings,
    stage: Stage,
    waiting: int,
    workers: Counter[str],
    leased: Counter[str],
) -> str:
    role = stage.role
    head = f"{waiting} waiting for {role}"
    if not workers[role]:
        return f"{head}, no {role} worker registered"
    if stage.gate is Gate.ADMIT:
        loaded = [w.loaded for w in state.workers.values() if w.role == role]
        if all(v is None for v in loaded):
            return f"{head}, no {role} worker has reported a loaded version"
        newest = max(v for v in loaded if v is not None)
        train_by = train_by_step(newest, settings.max_staleness)
        due = state.due
        if not admission_capacity(due, state.steps_done, settings.train_batch_groups, train_by):
            return (
                f"{head}: {role} refused by the staleness bound (version {newest} loaded, "
                f"{state.steps_done} steps done, max_staleness {settings.max_staleness})"
            )
    return f"{head} ({workers[role]} workers, {leased[role]} leases out)"


def _waiting(state: CoreState, stage: Stage) -> int:
    """Groups at ``stage``'s source that its role has neither done nor leased."""
    role = stage.role
    return sum(
        1
        for group in state.groups.values()
        if group.state == stage.source and role not in group.done and role not in group.leases
    )
