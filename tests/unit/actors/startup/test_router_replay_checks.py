"""Router replay is refused before a run starts, one line naming what rules it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.actors.startup.router_replay import replays_routes, router_replay_problems
from asyncrl.runtime.contract.config import ConfigError, config_from_dict
from tests.support.hf_families import hf_model_dir


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> str:
    return str(hf_model_dir(tmp_path_factory.mktemp("moe"), "qwen3-moe"))


def config(path: str, ref_logp: bool = False, workers: int = 1, **backends):
    return config_from_dict(
        {
            "model": {"path": path},
            "backends": backends,
            "pipeline": {"workers": {"train": workers}},
            "algorithm": {"router_replay": {"enabled": True, "ref_logp": ref_logp}},
        }
    )


def test_a_mixture_of_experts_on_our_engines_passes(moe: str) -> None:
    for cfg in (config(moe), config(moe, train="megatron")):
        for role in ("generate", "logp", "ref_logp", "train"):
            assert router_replay_problems(cfg, role) == []
    cfg = config(moe)
    assert [replays_routes(cfg, r) for r in ("logp", "ref_logp", "train", "critic")] == [
        True,
        False,
        True,
        False,
    ]
    assert replays_routes(config(moe, ref_logp=True), "ref_logp")


def test_a_model_without_experts_is_refused(tmp_path: Path) -> None:
    dense = str(hf_model_dir(tmp_path, "qwen3-untied-bias"))
    (problem,) = router_replay_problems(config(dense), "train")
    assert problem.startswith("algorithm.router_replay.enabled: the model at model.path=")
    assert "has no mixture-of-experts layers" in problem


@pytest.mark.parametrize(
    ("role", "backends", "expected"),
    [
        ("generate", {"generate": "vllm"}, "backends.generate='vllm': vLLM returns its routes"),
        ("generate", {"generate": "sglang"}, "backends.generate='sglang': this SGLang adapter"),
        (
            "train",
            {"train": "megatron", "megatron": {"pipeline_parallel": 2}},
            "backends.megatron.pipeline_parallel=2: megatron replays routes here without",
        ),
    ],
)
def test_an_engine_that_cannot_record_or_replay_is_named(
    moe: str, role: str, backends: dict[str, str], expected: str
) -> None:
    (problem,) = router_replay_problems(config(moe, workers=2, **backends), role)
    assert expected in problem and "\n" not in problem


def test_off_asks_nothing_and_ref_logp_alone_is_a_config_error(tmp_path: Path) -> None:
    assert (
        router_replay_problems(config_from_dict({"backends": {"generate": "vllm"}}), "generate")
        == []
    )
    with pytest.raises(ConfigError, match="ref_logp"):
        config_from_dict({"algorithm": {"router_replay": {"ref_logp": True}}})
