"""The pipeline table: the default is what the design says; bad tables are refused clearly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncrl.runtime.contract.stages import (
    DEFAULT_PIPELINE,
    Gate,
    Pipeline,
    PipelineError,
    Role,
    Stage,
)
from asyncrl.runtime.contract.stages import GroupState as S

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
    assert renamed.reads(renamed.stages[0]) == {"loader"}  # the entry's payload, by any name


def test_a_lease_carries_what_its_stage_reads_and_nothing_else() -> None:
    reads = {s.role: sorted(DEFAULT_PIPELINE.reads(s)) for s in DEFAULT_PIPELINE.stages}
    assert reads == {
        "generate": ["dataloader"],
        "logp": ["generate"],
        "ref_logp": ["generate"],
        "reward": ["dataloader", "generate"],
        "train": ["generate", "logp", "ref_logp", "reward"],
    }
    # harnesses make the rollouts in the generators' place; without a KL term no ref_logp
    table = DEFAULT_PIPELINE.admitting_with(Role.HARNESS).without(Role.REF_LOGP)
    reads = {s.role: sorted(table.reads(s)) for s in table.stages}
    assert reads["logp"] == ["harness"]
    assert reads["train"] == ["harness", "logp", "reward"]
    # a row that names nothing reads everything made before its source
    plain = Pipeline(tuple(replace(s, reads=None) for s in DEFAULT_PIPELINE.stages))
    assert plain.reads(plain.stages[3]) == {"dataloader", "generate"}
    assert plain.reads(plain.stages[4]) == {"dataloader", "generate", "logp", "ref_logp", "reward"}
    # and a row may not read what is made only after it, or by nobody
    early = replace(DEFAULT_PIPELINE.stages[1], reads=(Role.REWARD,))
    with pytest.raises(PipelineError, match=r"logp.*reads \['reward'\].*may read"):
        Pipeline((DEFAULT_PIPELINE.stages[0], early, *DEFAULT_PIPELINE.stages[2:]))


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
