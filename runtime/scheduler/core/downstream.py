"""What lies downstream of a stage in a pipeline: the stages a group passes through after
it, their roles, and the states it can be in once the stage is done with it."""

from __future__ import annotations

from asyncrl.runtime.contract.stages import GroupState, Pipeline, Stage

__all__ = ["derived_roles", "stages_after", "states_after"]


def derived_roles(pipeline: Pipeline, stage: Stage) -> frozenset[str]:
    """``stage``'s role and the roles of every stage downstream of its target."""
    return frozenset({stage.role, *(later.role for later in stages_after(pipeline, stage))})


def states_after(pipeline: Pipeline, stage: Stage) -> frozenset[GroupState]:
    """The states a group can be in once ``stage`` has finished with it."""
    reached = (x for later in stages_after(pipeline, stage) for x in (later.working, later.target))
    return frozenset({stage.target, *(x for x in reached if x is not None)})


def stages_after(pipeline: Pipeline, stage: Stage) -> list[Stage]:
    """Every stage a group may pass through after ``stage``."""
    found: list[Stage] = []
    seen, frontier = set(), [stage.target]
    while frontier:
        state = frontier.pop()
        if state in seen:
            continue
        seen.add(state)
        for later in pipeline.consumers(state):
            found.append(later)
            frontier.append(later.target)
    return found
