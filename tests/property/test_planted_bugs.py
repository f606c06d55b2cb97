"""The state-machine test must catch a wrong table: plant one and expect a failure.

Each planted table passes the table's own structural validation, so only the behaviour
checks (the model and the invariants) can find it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Gate, Pipeline, Role, Stage
from asyncrl.runtime.contract.stages import GroupState as S

from .core_machine import make_machine

GENERATE = Stage(Role.GENERATE, S.PENDING, S.GENERATED, S.GENERATING, Gate.ADMIT)
TRAIN = Stage(Role.TRAIN, S.READY, S.TRAINED, S.TRAINING, Gate.STEP)
SCORING = tuple(Stage(role, S.GENERATED, S.READY) for role in (Role.LOGP, Role.REF_LOGP))

PLANTED = {
    # train reads `generated`: generated → training, skipping logp, ref_logp and reward
    "generated→training": Pipeline(
        (GENERATE, Stage(Role.TRAIN, S.GENERATED, S.TRAINED, S.TRAINING, Gate.STEP))
    ),
    # the reward branch is missing: groups join into ready unrewarded
    "no reward branch": Pipeline((GENERATE, *SCORING, TRAIN)),
    # generation lands in ready: generating → ready
    "generating→ready": Pipeline(
        (
            Stage(Role.GENERATE, S.PENDING, S.READY, S.GENERATING, Gate.ADMIT),
            *SCORING,
            Stage(Role.REWARD, S.GENERATED, S.READY),
            TRAIN,
        )
    ),
}

PPO = DEFAULT_PIPELINE.with_critic()


def _ppo(change) -> Pipeline:
    """PPO's table with each row passed through ``change`` (None drops the row)."""
    rows = (change(stage) for stage in PPO.stages)
    return Pipeline(tuple(row for row in rows if row is not None))


def _unread(stage: Stage) -> Stage:
    return replace(stage, reads=None)


PLANTED |= {
    # no values branch: groups reach the critic (and the train step) without values
    "no values branch": _ppo(lambda s: None if s.role == Role.VALUES else _unread(s)),
    # the critic's row is a plain stage: any number of groups, no step or version counted
    "critic step ungated": _ppo(
        lambda s: (
            replace(s, gate=Gate.FREE)
            if s.gate is Gate.CRITIC_STEP
            else replace(s, reads_critic=False)
        )
    ),
}

FIND = settings(
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_machine_finds_a_planted_row(name: str) -> None:
    table = PLANTED[name]
    # PPO's plants are of the table with a values stage, and judged against its model
    machine = make_machine(table, values_stage=True if table.for_role(Role.CRITIC) else None)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=FIND)
