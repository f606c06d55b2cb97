"""The demo roles' work functions: exact values, so pipeline tests can check every result."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE
from tests.support import demo_pipeline as demo


def test_roles_cover_every_worker_role_under_its_own_name() -> None:
    # The default table's roles (a harness is not what the demo runs)
    assert sorted(demo.ROLES) == sorted(DEFAULT_PIPELINE.worker_roles)
    for role, cls in demo.ROLES.items():
        assert cls.role == role


def test_the_formulas_on_known_groups() -> None:
    assert demo.prompt_key(42) == "q000042"
    tokens = demo.generate_tokens(9)  # 1 + 9 % 7 = 3 tokens from 9
    assert tokens.dtype == np.int32 and tokens.tolist() == [9, 10, 11]
    assert demo.logp_of(tokens) == 15.0
    assert demo.ref_logp_of(tokens) == -30.0
    assert demo.reward_of(9) == 1.0
    assert demo.expected_value(9) == 15.0 - 30.0 + 1.0 + 3


def test_train_value_reads_what_each_stage_left() -> None:
    tokens = demo.generate_tokens(5)
    data = {
        "generate": {"tokens": tokens},
        "logp": {"logp": demo.logp_of(tokens)},
        "ref_logp": {"ref": demo.ref_logp_of(tokens)},
        "reward": {"reward": demo.reward_of(5)},
    }
    assert demo.train_value(data) == demo.expected_value(5)


@pytest.mark.parametrize(
    ("spec", "role", "seconds"),
    [
        ("", "generate", 0.0),
        ("0.5", "train", 0.5),
        ("generate=2, train=0.25", "train", 0.25),
        ("generate=2", "logp", 0.0),
    ],
)
def test_work_time(spec: str, role: str, seconds: float) -> None:
    assert demo.work_time(role, spec) == seconds


def test_a_bad_work_time_names_the_variable() -> None:
    with pytest.raises(ValueError, match=demo.WORK_ENV):
        demo.work_time("generate", "generate=slow")


def test_the_dataloader_offers_keys_from_its_hint_on() -> None:
    loader = demo.Dataloader(start=3)
    first = loader.feed(2)
    assert [(g.key, g.data) for g in first] == [("q000003", {"x": 3}), ("q000004", {"x": 4})]
    assert [g.key for g in loader.feed(1)] == ["q000005"]
