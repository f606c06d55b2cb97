"""The pipeline table: the default is what the design says; bad tables are refused clearly."""

from __future__ import annotations

import pytest

from asyncrl.runtime.core.pipeline import (
    DEFAULT_PIPELINE,
    Gate,
    Pipeline,
    PipelineError,
    Role,
    Stage,
)
from asyncrl.runtime.core.pipeline import GroupState as S

GENERATE = Stage(Role.GENERATE, S.PENDING, S.GENERATED, S.GENERATING, Gate.ADMIT)
TRAIN = Stage(Role.TRAIN, S.READY, S.TRAINED, S.TRAINING, Gate.STEP)
LOGP = Stage(Role.LOGP, S.GENERATED, S.READY)


def test_default_table_has_the_designed_moves() -> None:
    edges = set(DEFAULT_PIPELINE.edges())
    forward = {
        (S.PENDING, S.GENERATING),
        (S.GENERATING, S.GENERATED),
        (S.GENERATED, S.READY),
        (S.READY, S.TRAINING),
        (S.TRAINING, S.TRAINED),
    }
    assert forward <= edges
    assert (S.GENERATED, S.TRAINING) not in edges
    assert [s.role for s in DEFAULT_PIPELINE.consumers(S.GENERATED)] == [
        "logp",
        "ref_logp",
        "reward",
    ]
    assert DEFAULT_PIPELINE.consumers(S.TRAINED) == ()


def test_a_critic_is_one_more_row() -> None:
    critic = Stage("critic", S.GENERATED, S.READY)
    pipeline = Pipeline((*DEFAULT_PIPELINE.stages, critic))
    assert "critic" in pipeline.roles
    assert len(pipeline.consumers(S.GENERATED)) == 4


def test_the_entry_role_is_declared_with_the_table() -> None:
    assert DEFAULT_PIPELINE.entry_role == "dataloader"
    assert DEFAULT_PIPELINE.worker_roles == (
        "dataloader",
        "generate",
        "logp",
        "ref_logp",
        "reward",
        "train",
    )
    renamed = Pipeline(DEFAULT_PIPELINE.stages, entry_role="loader")
    assert renamed.worker_roles[0] == "loader" and "dataloader" not in renamed.worker_roles


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ((GENERATE, LOGP, Stage(Role.REWARD, S.GENERATED, S.TRAINED), TRAIN), "one target"),
        ((GENERATE, Stage(Role.LOGP, S.GENERATED, S.READY, S.TRAINING), TRAIN), "working state"),
        ((GENERATE, LOGP, LOGP, TRAIN), "two stages of one role"),
        ((GENERATE, LOGP), "exactly one step stage"),
        ((GENERATE, LOGP, TRAIN, Stage("again", S.READY, S.PENDING)), "several readers"),
        ((GENERATE, LOGP, TRAIN, Stage("loop", S.TRAINED, S.PENDING)), "cycle"),
        ((GENERATE, LOGP, TRAIN, Stage("x", S.TRAINED, S.DEAD)), "dead"),
        ((GENERATE, LOGP, TRAIN, Stage(Role.DATALOADER, S.TRAINED, S.READY)), "adds groups"),
        (
            (GENERATE, Stage(Role.TRAIN, S.READY, S.TRAINED, None, Gate.STEP), LOGP),
            "must be exclusive",
        ),
    ],
)
def test_bad_tables_name_the_problem(rows: tuple[Stage, ...], message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        Pipeline(rows)


def test_a_branch_nobody_reads_can_be_left_out_and_the_others_join_without_it() -> None:
    table = DEFAULT_PIPELINE.without(Role.REF_LOGP)
    assert [s.role for s in table.consumers(S.GENERATED)] == [Role.LOGP, Role.REWARD]
    assert Role.REF_LOGP not in table.worker_roles
    assert (S.GENERATED, S.READY) in set(table.edges())


@pytest.mark.parametrize("role", [Role.GENERATE, Role.TRAIN, "critic"])
def test_only_a_branch_stage_can_be_left_out(role: str) -> None:
    with pytest.raises(PipelineError, match=role):
        DEFAULT_PIPELINE.without(role)
