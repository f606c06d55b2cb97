"""backends.train=megatron at start: its config keys are validated with errors naming
them, and a machine without megatron-core is told in one line what to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from asyncrl.actors.engines.train_checks import MEGATRON_MISSING, train_engine_problems
from asyncrl.actors.startup.role_checks import check_engine
from asyncrl.runtime.contract.config import ConfigError, config_from_dict


def megatron(**sizes: int) -> dict:
    return {"backends": {"train": "megatron", "megatron": sizes}}


def test_the_sizes_default_to_one_and_are_read() -> None:
    data = megatron(tensor_parallel=2, expert_parallel=2)
    data["pipeline"] = {"workers": {"train": 4}}
    cfg = config_from_dict(data)
    assert cfg.backends.megatron.tensor_parallel == 2
    assert cfg.backends.megatron.pipeline_parallel == 1
    assert cfg.backends.megatron.model_parallel == 4


@pytest.mark.parametrize("key", ["tensor_parallel", "pipeline_parallel", "expert_parallel"])
def test_a_size_below_one_is_named(key: str) -> None:
    with pytest.raises(ConfigError, match=f"backends.megatron.{key}"):
        config_from_dict(megatron(**{key: 0}))


def test_sizes_whose_product_does_not_divide_the_trainer_group_are_named() -> None:
    data = megatron(tensor_parallel=2, pipeline_parallel=2)
    data["pipeline"] = {"workers": {"train": 6}}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    message = str(info.value)
    assert "backends.megatron" in message and "pipeline.workers.train=6" in message
    data["pipeline"] = {"workers": {"train": 8}}
    assert config_from_dict(data).backends.megatron.model_parallel == 4


def test_a_scorer_group_must_hold_whole_copies_too_and_one_scorer_need_not() -> None:
    data = megatron(tensor_parallel=2)
    data["pipeline"] = {"workers": {"train": 2, "ref_logp": 3}}
    with pytest.raises(ConfigError, match=r"pipeline\.workers\.ref_logp=3"):
        config_from_dict(data)
    data["pipeline"] = {"workers": {"train": 2, "logp": 1, "ref_logp": 4}}
    assert config_from_dict(data).pipeline.workers["logp"] == 1


def test_the_sizes_are_not_checked_against_the_group_for_the_torch_engine() -> None:
    cfg = config_from_dict({"backends": {"megatron": {"tensor_parallel": 2}}})
    assert cfg.backends.train == "torch"


def test_megatron_is_not_refused_where_megatron_core_imports() -> None:
    pytest.importorskip("megatron.core")
    cfg = config_from_dict(megatron())
    for role in ("train", "logp", "ref_logp"):
        assert check_engine(cfg, role) == []
    assert check_engine(cfg, "generate") == []  # generate keeps backends.generate


def test_a_trainer_group_is_taken_and_what_is_not_wired_is_refused_by_name() -> None:
    pytest.importorskip("megatron.core")
    data = megatron(tensor_parallel=2)
    data["pipeline"] = {"workers": {"train": 2}}
    assert train_engine_problems(config_from_dict(data), "train") == []
    data["pipeline"] = {"workers": {"train": 2, "logp": 2}}
    assert train_engine_problems(config_from_dict(data), "logp") == []
    data = megatron(pipeline_parallel=2)
    data["pipeline"] = {"workers": {"train": 2, "logp": 2}}
    for role in ("train", "logp"):
        assert train_engine_problems(config_from_dict(data), role) == []
    data = megatron(expert_parallel=2, tensor_parallel=2)
    data["pipeline"] = {"workers": {"train": 4}}
    (problem,) = train_engine_problems(config_from_dict(data), "train")
    assert "expert_parallel=2" in problem and "tensor_parallel=2" in problem
    assert "backends.megatron" in problem


def test_expert_parallel_ranks_are_taken_for_a_mixture_of_experts_only(tmp_path) -> None:
    """What the model's experts rule out is named with the key and the model's path: tensor
    parallelism with experts, expert parallelism without any, or not dividing them."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("transformers")
    from tests.support.hf_families import hf_model_dir

    four = str(hf_model_dir(tmp_path / "four", "qwen3-moe"))  # 4 experts
    three = str(hf_model_dir(tmp_path / "three", "qwen3-moe-unnormalised-tied"))

    def problems(path: str, workers: int, **sizes: int) -> list[str]:
        data = megatron(**sizes)
        data["pipeline"] = {"workers": {"train": workers, "logp": workers}}
        data["model"] = {"path": path}
        return train_engine_problems(config_from_dict(data), "train")

    assert problems(four, 2, expert_parallel=2) == []
    assert problems(four, 4, expert_parallel=2, pipeline_parallel=2) == []
    assert problems(four, 1) == []
    (problem,) = problems(four, 2, tensor_parallel=2)
    assert "backends.megatron.tensor_parallel=2" in problem and four in problem
    assert "mixture-of-experts" in problem
    (problem,) = problems("embedded", 2, expert_parallel=2)
    assert "backends.megatron.expert_parallel=2" in problem and "no experts" in problem
    (problem,) = problems(three, 2, expert_parallel=2)
    assert "backends.megatron.expert_parallel=2" in problem and "3 experts" in problem


def test_without_megatron_core_the_start_fails_with_one_line_naming_the_extra() -> None:
    """megatron-core made unimportable in a fresh interpreter (``sys.modules`` entry None)."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["megatron"] = None
        from asyncrl.actors.startup.role_checks import check_engine
        from asyncrl.actors.startup.model_loading import load_policy
        from asyncrl.runtime.contract.config import config_from_dict
        cfg = config_from_dict({"backends": {"train": "megatron"}})
        for role in ("train", "logp", "ref_logp"):
            print(check_engine(cfg, role))
        try:
            load_policy(cfg, "train")
        except RuntimeError as error:
            print("load_policy:", error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [repr([MEGATRON_MISSING])] * 3 + [f"load_policy: {MEGATRON_MISSING}"]
    assert "\n" not in MEGATRON_MISSING and "pip install 'asyncrl[gpu]'" in MEGATRON_MISSING
