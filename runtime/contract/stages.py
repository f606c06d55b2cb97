"""The pipeline as data: group states, roles and the table of stages between them.

A *stage* is one row: a role takes a group from a ``source`` state to a ``target`` state.
The core reads this table and nothing else to know what a role may claim, so a new stage
(a critic's values, a validation stream) is a new row, not an edit of the core.

Two shapes of row exist:

- an *exclusive* stage names a ``working`` state: while leased, the group sits there
  (``pending → generating → generated``); it must be the only stage reading its source;
- *branch* stages have no working state: several may read the same source at once, the
  group stays in the source while they run, and joins into their common target once every
  branch has completed (``generated → {logp, ref_logp, reward} → ready``).

Two stages carry the pipeline's policy (``Gate``): the ``ADMIT`` stage is where groups are
released under the staleness bound and stamped with behaviour versions; the ``STEP`` stage
takes exactly one train batch at a time and advances the step counter. A branch stage
that ``reads_policy`` computes with the trainer's weights (``logp``): when training rolls
back, its results made with weights that no longer exist are computed again.

A learned critic (PPO's, :meth:`Pipeline.with_critic`) adds the ``CRITIC_STEP`` stage, the
critic's update, which takes one batch at a time like the train step, counts its own steps
and versions, and hands its groups on to the train step; and, unless that step makes the
values itself in its update's forward pass, a ``values`` branch that ``reads_critic`` (the
critic's forward, at the critic version its worker holds).

A stage names the payloads it ``reads``: the roles whose results its workers are handed
with a lease (the entry role's prompt, the generator's rollouts). A lease carries those
and nothing else, so no bytes move for nothing, and a worker can only report lost a
payload it was given. A row that names none reads everything made before it (the safe
choice for a stage added without thought for it); :data:`ENTRY` names the entry role's
payload, whatever the table calls that role.

A branch stage that ``filters`` may say, with its result, that a group carries no learning
signal (dynamic sampling: the rewards of all its responses alike): the group then leaves
the pipeline from the stage's source as ``filtered``, a final state no row names, its
sibling branches let go of it, and it is never trained (scheduler/core/transitions.py).

A *serving* role takes no stage: its workers register, follow the policy versions and
serve another role's work outside the table (generators answering a harness's model calls
over HTTP while the ``harness`` role holds the admit stage; :meth:`Pipeline.admitting_with`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum

__all__ = [
    "DEFAULT_PIPELINE",
    "ENTRY",
    "FINAL_STATES",
    "Gate",
    "GroupState",
    "Pipeline",
    "PipelineError",
    "Role",
    "Stage",
]


class GroupState(StrEnum):
    PENDING = "pending"
    GENERATING = "generating"
    GENERATED = "generated"
    READY = "ready"
    CRITIC_TRAINING = "critic_training"
    CRITIC_TRAINED = "critic_trained"
    TRAINING = "training"
    TRAINED = "trained"
    DEAD = "dead"
    # Trained by a step that a rollback lost: the group's prompt is back as a new group
    # (the RolledBack rule, scheduler/core/transitions.py), and this one is counted here,
    # never in the table again.
    SUPERSEDED = "superseded"
    # Its rewards carried no learning signal (dynamic sampling, algorithm.filter_groups):
    # left out of training by the stage that found it so, from that stage's source.
    FILTERED = "filtered"


FINAL_STATES = frozenset(
    {GroupState.TRAINED, GroupState.DEAD, GroupState.SUPERSEDED, GroupState.FILTERED}
)
"""States a group never leaves: the rest are in flight."""


class Role(StrEnum):
    """The built-in roles. A stage may name any other role string: that is an extension."""

    DATALOADER = "dataloader"
    GENERATE = "generate"
    LOGP = "logp"
    REF_LOGP = "ref_logp"
    REWARD = "reward"
    VALUES = "values"  # the critic's forward over a trajectory
    CRITIC = "critic"  # the critic's update
    TRAIN = "train"
    HARNESS = "harness"  # agent harnesses, driving the generators over HTTP


ENTRY = "@entry"  # in a stage's ``reads``: what the entry role added the group with


class Gate(StrEnum):
    """What the core checks before it hands out work of a stage."""

    FREE = "free"  # any available group, as many as asked for
    ADMIT = "admit"  # released under the staleness bound; completion carries versions
    STEP = "step"  # exactly one train batch at a time; completion is a train step
    # the same for the critic: one batch at a time, completion is a step of the critic
    CRITIC_STEP = "critic_step"

    @property
    def batched(self) -> bool:
        """Takes one whole batch at a time, in train-by order, and completes it whole."""
        return self in (Gate.STEP, Gate.CRITIC_STEP)


class PipelineError(ValueError):
    """The table is inconsistent; the message names the offending row."""


@dataclass(frozen=True, slots=True)
class Stage:
    role: str
    source: GroupState
    target: GroupState
    working: GroupState | None = None
    gate: Gate = Gate.FREE
    reads_policy: bool = False  # its result depends on the policy version it ran with
    reads_critic: bool = False  # its result depends on the critic version its worker holds
    reads: tuple[str, ...] | None = None  # the roles' payloads it is handed; None: all before
    # its result may say a group carries no learning signal: the group is then filtered
    filters: bool = False

    def __str__(self) -> str:
        via = f" → {self.working}" if self.working else ""
        return f"{self.role}: {self.source}{via} → {self.target} [{self.gate}]"


@dataclass(frozen=True)
class Pipeline:
    """A validated table of stages with the lookups the core needs, computed once."""

    stages: tuple[Stage, ...]
    entry: GroupState = GroupState.PENDING
    # The role that adds groups (into ``entry``); what it adds them with is filed under it.
    entry_role: str = Role.DATALOADER.value
    # Roles whose workers register and follow versions but are leased nothing (see above).
    serving: tuple[str, ...] = ()
    _by_source: dict[GroupState, tuple[Stage, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        by_source: dict[GroupState, list[Stage]] = {}
        for stage in self.stages:
            by_source.setdefault(stage.source, []).append(stage)
        object.__setattr__(self, "_by_source", {k: tuple(v) for k, v in by_source.items()})
        _validate(self)

    def consumers(self, state: GroupState) -> tuple[Stage, ...]:
        """The stages that read groups in ``state`` (empty for a final state)."""
        return self._by_source.get(state, ())

    def stage_at(self, state: GroupState, role: str) -> Stage:
        for stage in self.consumers(state):
            if stage.role == role:
                return stage
        raise KeyError(f"no stage of role {role!r} reads {state}")

    def for_role(self, role: str) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if s.role == role)

    def gated(self, gate: Gate) -> Stage:
        return next(s for s in self.stages if s.gate is gate)

    def reads(self, stage: Stage) -> frozenset[str]:
        """The roles whose payloads a lease of ``stage`` carries."""
        if stage.reads is not None:
            return frozenset(self.entry_role if r == ENTRY else str(r) for r in stage.reads)
        return self._made_before(stage.source)

    def _made_before(self, state: GroupState) -> frozenset[str]:
        """The entry role and every role whose stage a group passes before ``state``."""
        made = {str(self.entry_role)}
        for stage in self.stages:
            if state in self._reached_from(stage.target):
                made.add(str(stage.role))
        return frozenset(made)

    def _reached_from(self, state: GroupState) -> set[GroupState]:
        seen, frontier = set(), [state]
        while frontier:
            current = frontier.pop()
            if current not in seen:
                seen.add(current)
                frontier.extend(s.target for s in self.consumers(current))
        return seen

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles of the stages, in table order (the entry role has no stage)."""
        return tuple(dict.fromkeys(s.role for s in self.stages))

    @property
    def worker_roles(self) -> tuple[str, ...]:
        """Every role a worker may serve: the entry role, the stages' roles, then the
        serving roles."""
        roles = (self.entry_role, *self.roles, *self.serving)
        return tuple(dict.fromkeys(str(role) for role in roles))

    def without(self, role: str) -> Pipeline:
        """This table less ``role``'s stages: a branch whose result nobody reads is not run.

        Only branch stages can go (an exclusive stage carries groups on to later states);
        PipelineError otherwise.
        """
        dropped = self.for_role(role)
        if not dropped:
            raise PipelineError(f"no stage of role {role!r} to leave out")
        for stage in dropped:
            if stage.working is not None or len(self.consumers(stage.source)) < 2:
                raise PipelineError(f"{stage}: only a branch stage can be left out")
        kept = tuple(
            s if s.reads is None else replace(s, reads=tuple(r for r in s.reads if r != role))
            for s in self.stages
            if s.role != role
        )
        return Pipeline(kept, self.entry, self.entry_role, self.serving)

    def admitting_with(self, role: str) -> Pipeline:
        """This table with ``role`` doing the admit stage's work in its place; the role it
        replaces stays, as a serving role (the harness drives the generators)."""
        admit = self.gated(Gate.ADMIT)
        swapped = replace(admit, role=role)

        def renamed(stage: Stage) -> Stage:  # what the admit stage made is filed under role
            if stage is admit:
                return swapped
            if stage.reads is None:
                return stage
            return replace(stage, reads=tuple(role if r == admit.role else r for r in stage.reads))

        stages = tuple(renamed(s) for s in self.stages)
        return Pipeline(stages, self.entry, self.entry_role, (*self.serving, admit.role))

    def with_critic(self, values_stage: bool = True) -> Pipeline:
        """This table with a learned critic: the critic's step between the branches' join
        and the train step, which then reads the values too (for its advantages).

        ``values_stage``: a ``values`` branch beside the stage that reads the policy makes
        them, at the critic version its worker holds; without it the critic's step makes
        them itself, in the forward pass of its update, and hands them on with its result
        (the train step reads the critic's payload).
        """
        if self.for_role(Role.VALUES) or self.for_role(Role.CRITIC):
            raise PipelineError("the table has a critic already")
        scorer = next((s for s in self.stages if s.reads_policy), None)
        if scorer is None:
            raise PipelineError("no stage reads the policy: nowhere to put the values branch")
        admit, step = self.gated(Gate.ADMIT), self.gated(Gate.STEP)
        if scorer.target != step.source:
            raise PipelineError(f"{scorer}: its branches do not join where the train step reads")
        values = Stage(
            Role.VALUES, scorer.source, scorer.target, reads_critic=True, reads=(admit.role,)
        )
        critic = Stage(
            Role.CRITIC,
            step.source,
            GroupState.CRITIC_TRAINED,
            GroupState.CRITIC_TRAINING,
            Gate.CRITIC_STEP,
            reads=(admit.role, Role.REWARD, *([Role.VALUES] if values_stage else [])),
        )
        maker = Role.VALUES if values_stage else Role.CRITIC
        reads = None if step.reads is None else (*step.reads, maker)
        train = replace(step, source=GroupState.CRITIC_TRAINED, reads=reads)
        stages = [s for s in self.stages if s is not step]
        if values_stage:
            stages.insert(stages.index(scorer) + 1, values)
        return Pipeline((*stages, critic, train), self.entry, self.entry_role, self.serving)

    def edges(self) -> Iterator[tuple[GroupState, GroupState]]:
        """Every (from, to) move a group may make, failures and deaths included."""
        for stage in self.stages:
            if stage.working is None:
                yield stage.source, stage.target
                continue
            yield stage.source, stage.working
            yield stage.working, stage.target
            yield stage.working, stage.source  # lease lost: back to the stable state
        for stage in self.stages:  # its payload lost with its holder: made again
            for later in self._downstream(stage.target):
                yield later, stage.source
        for stage in self.stages:  # a result that says the group carries no signal
            if stage.filters:
                yield stage.source, GroupState.FILTERED
        for state in self._states():
            if state is not GroupState.DEAD:
                yield state, GroupState.DEAD

    def _downstream(self, state: GroupState) -> list[GroupState]:
        """``state`` and the states a group passes through after it, short of final ones."""
        found: list[GroupState] = []
        frontier = [state]
        while frontier:
            current = frontier.pop()
            if current in found or not self.consumers(current):
                continue
            found.append(current)
            for stage in self.consumers(current):
                if stage.working is not None:
                    found.append(stage.working)
                frontier.append(stage.target)
        return found

    def _states(self) -> Iterable[GroupState]:
        seen = {self.entry}
        for stage in self.stages:
            seen.update(x for x in (stage.source, stage.target, stage.working) if x)
        return seen


def _validate(pipeline: Pipeline) -> None:
    checks = (_check_rows, _check_sources, _check_gates, _check_acyclic, _check_reads)
    for check in checks:
        check(pipeline)


def _check_rows(pipeline: Pipeline) -> None:
    working_of: dict[GroupState, Stage] = {}
    for role in pipeline.serving:
        if role == pipeline.entry_role or pipeline.for_role(role):
            raise PipelineError(f"serving role {role!r} adds or takes groups; it serves only")
    for stage in pipeline.stages:
        if stage.role == pipeline.entry_role:
            raise PipelineError(f"{stage}: the entry role {stage.role} adds groups, it takes none")
        if GroupState.DEAD in (stage.source, stage.target, stage.working):
            raise PipelineError(f"{stage}: 'dead' is reached by failure only, never by a row")
        if GroupState.SUPERSEDED in (stage.source, stage.target, stage.working):
            raise PipelineError(f"{stage}: 'superseded' is reached by a rollback, never by a row")
        if GroupState.FILTERED in (stage.source, stage.target, stage.working):
            raise PipelineError(f"{stage}: 'filtered' is reached by a filtering stage, never a row")
        if stage.filters and (stage.working is not None or stage.gate is not Gate.FREE):
            # A gated stage makes promises (admission, the step) that a group leaving from
            # its working state would break; a branch leaves nothing half done.
            raise PipelineError(f"{stage}: only a branch stage filters groups")
        if stage.source == stage.target:
            raise PipelineError(f"{stage}: source and target are the same state")
        if (stage.reads_policy or stage.reads_critic) and stage.working is not None:
            raise PipelineError(f"{stage}: only a branch stage reads a model's versions")
        if stage.working is None:
            continue
        if stage.working in working_of:
            raise PipelineError(f"{stage}: working state shared with {working_of[stage.working]}")
        if pipeline.consumers(stage.working):
            raise PipelineError(f"{stage}: working state {stage.working} is also a source")
        working_of[stage.working] = stage


def _check_sources(pipeline: Pipeline) -> None:
    for source, stages in pipeline._by_source.items():
        roles = [s.role for s in stages]
        if len(set(roles)) != len(roles):
            raise PipelineError(f"two stages of one role read {source}: {roles}")
        if len(stages) == 1:
            continue
        if any(s.working is not None for s in stages):
            raise PipelineError(f"{source} has several readers; branches take no working state")
        if len({s.target for s in stages}) != 1:
            raise PipelineError(f"branches from {source} must join into one target")


def _check_gates(pipeline: Pipeline) -> None:
    for gate in (Gate.ADMIT, Gate.STEP):
        rows = [s for s in pipeline.stages if s.gate is gate]
        if len(rows) != 1:
            raise PipelineError(f"the table needs exactly one {gate} stage, found {len(rows)}")
    admit = pipeline.gated(Gate.ADMIT)
    if admit.source != pipeline.entry:
        raise PipelineError(f"{admit}: the admit stage must read the entry state {pipeline.entry}")
    critic = [s for s in pipeline.stages if s.gate is Gate.CRITIC_STEP]
    if len(critic) > 1:
        raise PipelineError(f"the table has {len(critic)} {Gate.CRITIC_STEP} stages, at most 1")
    for stage in (admit, pipeline.gated(Gate.STEP), *critic):
        if stage.working is None:
            raise PipelineError(f"{stage}: a gated stage must be exclusive (name a working state)")
    readers = [s for s in pipeline.stages if s.reads_critic]
    if readers and not critic:
        raise PipelineError(f"{readers[0]}: reads the critic, but no stage trains one")


def _check_acyclic(pipeline: Pipeline) -> None:
    """Groups only move forward: a cycle would let a group be trained twice."""
    done: set[GroupState] = set()

    def visit(state: GroupState, path: tuple[GroupState, ...]) -> None:
        if state in path:
            raise PipelineError(f"the table has a cycle: {' → '.join((*path, state))}")
        if state in done:
            return
        for stage in pipeline.consumers(state):
            visit(stage.target, (*path, state))
        done.add(state)

    for state in list(pipeline._by_source):
        visit(state, ())


def _check_reads(pipeline: Pipeline) -> None:
    for stage in pipeline.stages:
        if stage.reads is None:
            continue
        before = pipeline._made_before(stage.source)
        unknown = sorted(pipeline.reads(stage) - before)
        if unknown:
            raise PipelineError(
                f"{stage}: reads {unknown}, which no stage makes before it "
                f"(it may read {sorted(before)})"
            )


S = GroupState
R = Role
DEFAULT_PIPELINE = Pipeline(
    (
        Stage(R.GENERATE, S.PENDING, S.GENERATED, S.GENERATING, Gate.ADMIT, reads=(ENTRY,)),
        Stage(R.LOGP, S.GENERATED, S.READY, reads_policy=True, reads=(R.GENERATE,)),
        Stage(R.REF_LOGP, S.GENERATED, S.READY, reads=(R.GENERATE,)),
        # the prompt's answer and the responses; a group whose rewards carry no signal is
        # filtered here (algorithm.filter_groups)
        Stage(R.REWARD, S.GENERATED, S.READY, reads=(ENTRY, R.GENERATE), filters=True),
        Stage(
            R.TRAIN,
            S.READY,
            S.TRAINED,
            S.TRAINING,
            Gate.STEP,
            reads=(R.GENERATE, R.LOGP, R.REF_LOGP, R.REWARD),
        ),
    )
)
