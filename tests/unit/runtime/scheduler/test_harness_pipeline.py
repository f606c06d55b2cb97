"""With data.harness, the harness role holds the admit stage and generate only serves."""

from __future__ import annotations

import pytest

from asyncrl.actors.startup.role_checks import check_harness
from asyncrl.runtime.contract.config import config_from_dict, pipeline_for, workers_to_start
from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import (
    DEFAULT_PIPELINE,
    Gate,
    Pipeline,
    PipelineError,
    Role,
)
from asyncrl.runtime.contract.stages import GroupState as S
from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.effects import Accepted, Grant, Rejected

HARNESS = "tests.support.harnesses:ask_once"


def test_a_harness_takes_the_generate_stage_and_generate_stays_to_serve() -> None:
    cfg = config_from_dict({"data": {"harness": HARNESS}})
    table = pipeline_for(cfg)
    admit = table.gated(Gate.ADMIT)
    assert (admit.role, admit.source, admit.working, admit.target) == (
        Role.HARNESS, S.PENDING, S.GENERATING, S.GENERATED,
    )  # fmt: skip
    assert table.for_role(Role.GENERATE) == () and table.serving == (Role.GENERATE,)
    assert Role.REF_LOGP not in table.roles  # no KL penalty, as without a harness
    assert set(workers_to_start(cfg)) == {
        "dataloader", "generate", "logp", "reward", "train", "harness",
    }  # fmt: skip
    assert "harness" not in workers_to_start(config_from_dict({}))


def test_a_serving_role_takes_no_stage() -> None:
    with pytest.raises(PipelineError, match="serves only"):
        Pipeline(DEFAULT_PIPELINE.stages, serving=(Role.LOGP,))
    assert DEFAULT_PIPELINE.admitting_with("harness").without(Role.REF_LOGP).serving == (
        "generate",
    )


def test_the_core_registers_a_serving_generator_which_claims_nothing() -> None:
    table = DEFAULT_PIPELINE.admitting_with(Role.HARNESS)
    core = SchedulerCore(CoreSettings(max_staleness=1, train_batch_groups=2), table)
    assert isinstance(core.register("gen", "generate", 0.0), Accepted)
    assert isinstance(core.register("h", "harness", 0.0), Accepted)
    core.add_groups(["a", "b"])
    assert core.claim("generate", "gen", 2, 0.0) is None  # NoWork: the worker hears Shutdown
    refused = core.claim("harness", "h", 1, 0.0)
    assert isinstance(refused, Rejected) and refused.reason is Reason.BAD_VERSION
    core.loaded_version("h", 0)  # the oldest version its generators run
    lease = core.claim("harness", "h", 1, 0.0)
    assert isinstance(lease, Grant) and lease.version == 0
    assert isinstance(core.complete(lease.lease_id, lease.fence, lease.groups, [(0, 0)]), Accepted)
    assert core.state.groups[lease.groups[0]].state is S.GENERATED


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"harness": "tests.support.harnesses:not_async"}, "not an async function"),
        ({"harness": HARNESS, "reward": "math"}, "data.reward='math' with data.harness set"),
        (
            {"harness": HARNESS, "environment": "asyncrl.actors.tasks.calculator:Calculator"},
            "a run has one or the other",
        ),
        ({"harness": HARNESS, "harness_host": ""}, "data.harness_host: got ''"),
    ],
)
def test_the_harness_preflight_names_the_problem(data: dict, problem: str) -> None:
    problems = check_harness(config_from_dict({"data": data}))
    assert len(problems) == 1 and problem in problems[0]


def test_a_good_harness_has_no_problem() -> None:
    assert check_harness(config_from_dict({"data": {"harness": HARNESS}})) == []
