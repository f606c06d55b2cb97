"""Tests of asyncrl.runtime.contract.config: defaults, validation messages, overrides,
round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.runtime.contract.config import (
    WORKER_ROLES,
    ConfigError,
    RunConfig,
    config_from_dict,
    config_to_dict,
    describe_fields,
    dump_config,
    load_config,
    pipeline_for,
    workers_to_start,
)
from asyncrl.runtime.contract.stages import Gate

DEFAULT_YAML = Path(__file__).resolve().parents[4] / "deploy" / "configs" / "default.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(data: Any = None, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict({} if data is None else data, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------ defaults


def test_defaults() -> None:
    cfg = RunConfig()
    assert cfg.run.name == "arithmetic"
    assert cfg.run.dir == "runs/arithmetic"
    assert cfg.data.task == "asyncrl.actors.tasks.arithmetic:task"
    assert cfg.algorithm.lr == 2e-4
    assert cfg.pipeline.actors == "asyncrl.actors.roles"
    assert cfg.algorithm.estimator == "grpo"
    assert cfg.pipeline.max_staleness == 2
    assert cfg.pipeline.workers == dict.fromkeys(WORKER_ROLES, 1)
    assert cfg.scheduler.resources == {}
    assert (cfg.scheduler.control_port, cfg.scheduler.events_port) == (5555, 5556)


def test_defaults_pass_their_own_validation() -> None:
    assert config_from_dict(config_to_dict(RunConfig())) == RunConfig()


def test_no_file_and_empty_file_give_defaults(tmp_path: Path) -> None:
    assert load_config(None) == RunConfig()
    assert load_config(write(tmp_path, "")) == RunConfig()
    assert load_config(write(tmp_path, "# only a comment\n")) == RunConfig()


def test_empty_section_gives_its_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "pipeline:\n  # max_staleness: 0\n")) == RunConfig()


def test_mutable_defaults_are_not_shared() -> None:
    first, second = RunConfig(), RunConfig()
    assert first.pipeline.workers is not second.pipeline.workers


def test_default_yaml_equals_code_defaults() -> None:
    assert load_config(DEFAULT_YAML) == RunConfig()


def test_long_tail_yaml_names_a_packaged_model_that_holds_its_sequences() -> None:
    from asyncrl.actors.policy.checkpoint import PACKAGED, model_dir
    from asyncrl.actors.policy.model_dir_check import check_model_dir

    cfg = load_config(DEFAULT_YAML.with_name("long_tail.yaml"))
    assert cfg.data.task.endswith(":long_task") and cfg.model.path in PACKAGED
    check_model_dir(cfg.model.path)
    config = yaml.safe_load((model_dir(cfg.model.path) / "config.json").read_text())
    positions = config["max_position_embeddings"]
    assert cfg.model.max_prompt_tokens + cfg.model.max_new_tokens <= positions
    assert cfg.model.max_prompt_tokens >= 62 and cfg.model.max_new_tokens >= 302


def test_default_yaml_shows_every_key() -> None:
    data = yaml.safe_load(DEFAULT_YAML.read_text(encoding="utf-8"))
    described = {key for key, _, _ in describe_fields()}

    def keys(mapping: dict, prefix: str) -> set[str]:
        out = set()
        for key, value in mapping.items():
            path = f"{prefix}{key}"
            # A section within a section (backends.megatron) shows its own keys.
            nested = isinstance(value, dict) and path not in described
            out |= keys(value, f"{path}.") if nested else {path}
        return out

    assert keys(data, "") == described


def test_frozen() -> None:
    cfg = RunConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pipeline.max_staleness = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pipeline = cfg.pipeline  # type: ignore[misc]


def test_run_dir_expands_the_final_name() -> None:
    assert load_config(None, ["run.name=exp7"]).run.dir == "runs/exp7"
    custom = config_from_dict({"run": {"name": "a", "dir": "/scratch/{name}/x"}})
    assert custom.run.dir == "/scratch/a/x"


# ------------------------------------------------------------------------------ overrides


def test_overrides_scalar_dict_and_nested_key(tmp_path: Path) -> None:
    path = write(tmp_path, "pipeline:\n  max_staleness: 4\n")
    cfg = load_config(
        path,
        [
            "pipeline.max_staleness=0",
            "scheduler.resources={gpu: 2}",
            "pipeline.workers.generate=2",
            "algorithm.estimator=dr_grpo",
        ],
    )
    assert cfg.pipeline.max_staleness == 0
    assert cfg.scheduler.resources == {"gpu": 2}
    assert cfg.pipeline.workers == {**dict.fromkeys(WORKER_ROLES, 1), "generate": 2}
    assert cfg.algorithm.estimator == "dr_grpo"


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_the_critic_free_estimators_and_their_knobs_load(estimator: str) -> None:
    overrides = [
        f"algorithm.estimator={estimator}",
        "algorithm.gamma=0.99",
        "algorithm.ratio=sequence",
    ]
    cfg = load_config(None, overrides)
    assert (cfg.algorithm.estimator, cfg.algorithm.gamma) == (estimator, 0.99)
    assert cfg.algorithm.ratio == "sequence"


def test_later_override_wins() -> None:
    cfg = load_config(None, ["data.group_size=4", "data.group_size=16"])
    assert cfg.data.group_size == 16


def test_file_mapping_merges_over_default_mapping(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "pipeline:\n  workers: {generate: 3, reward: 0}\n"))
    assert cfg.pipeline.workers["generate"] == 3
    assert cfg.pipeline.workers["reward"] == 0
    assert cfg.pipeline.workers["train"] == 1


@pytest.mark.parametrize("text", ["1e-4", "1.0e-4", "0.0001"])
def test_float_accepts_exponent_forms(text: str) -> None:
    # PyYAML reads `1e-4` (no dot) as a string; it must still mean 0.0001.
    assert load_config(None, [f"algorithm.lr={text}"]).algorithm.lr == pytest.approx(1e-4)


def test_int_is_accepted_for_float() -> None:
    cfg = load_config(None, ["pipeline.lease_timeout_s=30"])
    assert cfg.pipeline.lease_timeout_s == 30.0
    assert isinstance(cfg.pipeline.lease_timeout_s, float)


def test_both_ports_zero_is_allowed() -> None:
    cfg = load_config(None, ["scheduler.control_port=0", "scheduler.events_port=0"])
    assert cfg.scheduler.control_port == cfg.scheduler.events_port == 0


def test_validation_can_be_turned_off() -> None:
    assert load_config(None, ["data.val_every_versions=0"]).data.val_every_versions == 0


def test_input_mapping_is_not_modified() -> None:
    data = {"pipeline": {"workers": {"generate": 2}}}
    config_from_dict(data, ["pipeline.workers.train=0"])
    assert data == {"pipeline": {"workers": {"generate": 2}}}


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # unknown keys, with a suggestion and the keys allowed
        ({"pipelin": {}}, ["pipelin: unknown key", "did you mean 'pipeline'?", "scheduler"]),
        (
            {"pipeline": {"max_stalenes": 1}},
            ["pipeline.max_stalenes: unknown key", "did you mean 'max_staleness'?"],
        ),
        (
            {"pipeline": {"workers": {"genrate": 2}}},
            ["pipeline.workers.genrate: unknown key", "'generate'", "ref_logp"],
        ),
        ({"zzz": 1}, ["zzz: unknown key (keys of the config: run, data"]),
        # wrong types
        (
            {"scheduler": {"control_port": "abc"}},
            ["scheduler.control_port: got 'abc' (str); allowed: an integer in 0..65535"],
        ),
        ({"data": {"group_size": 2.0}}, ["data.group_size: got 2.0 (float)", "integer >= 1"]),
        ({"data": {"group_size": True}}, ["data.group_size: got True (bool)"]),
        ({"algorithm": {"lr": False}}, ["algorithm.lr: got False (bool)", "a number > 0"]),
        ({"run": {"name": 7}}, ["run.name: got 7 (int); allowed: a string"]),
        # a line break would start a new line wherever the value is written (sbatch, logs)
        ({"run": {"name": "a\nb"}}, ["run.name: got 'a\\nb'; allowed: a string on one line"]),
        ({"run": {"dir": "/r/x\r#"}}, ["run.dir: got '/r/x\\r#'", "without control"]),
        ({"pipeline": [1, 2]}, ["pipeline: got [1, 2] (list); allowed: a mapping with keys"]),
        ({"pipeline": {"workers": 3}}, ["pipeline.workers: got 3 (int)", "a mapping"]),
        ({"scheduler": {"resources": {1: 2}}}, ["scheduler.resources: got key 1 (int)"]),
        # out of range
        (
            {"pipeline": {"max_staleness": -1}},
            ["pipeline.max_staleness: got -1; allowed: an integer >= 0"],
        ),
        ({"algorithm": {"lr": 0}}, ["algorithm.lr: got 0; allowed: a number > 0"]),
        (
            {"data": {"val_every_versions": -1}},
            ["data.val_every_versions: got -1; allowed: an integer >= 0"],
        ),
        (
            {"algorithm": {"is_cap": 5.0}},
            [
                "algorithm.is_cap: moved to algorithm.correction.offpolicy.cap and "
                "algorithm.correction.engine.cap"
            ],
        ),
        (
            {"algorithm": {"correction": {"offpolicy": {"cap": 0}}}},
            ["algorithm.correction.offpolicy.cap: got 0; allowed: a number > 0"],
        ),
        (
            {"algorithm": {"correction": {"engine": {"low": 0}}}},
            ["algorithm.correction.engine.low: got 0; allowed: a number > 0 and <= 1"],
        ),
        (
            {"algorithm": {"correction": {"engine": {"low": 1.5}}}},
            ["algorithm.correction.engine.low: got 1.5"],
        ),
        (
            {"algorithm": {"correction": {"engine": {"high": 0.9}}}},
            ["algorithm.correction.engine.high: got 0.9; allowed: a number >= 1"],
        ),
        (
            {"algorithm": {"correction": {"engine": {"reject": "icepop"}}}},
            ["algorithm.correction.engine.reject: got 'icepop'", "'geometric'"],
        ),
        (
            {"algorithm": {"correction": {"offpolicy": {"weight": "product"}}}},
            ["algorithm.correction.offpolicy.weight: got 'product'", "'sequence'"],
        ),
        (
            {"algorithm": {"policy_loss": "cispo", "ratio": "sequence"}},
            ["algorithm.policy_loss: got 'cispo' with algorithm.ratio='sequence'"],
        ),
        (
            {"algorithm": {"policy_loss": "cispo", "clip_ratio_c": 3.0}},
            ["algorithm.policy_loss: got 'cispo' with algorithm.clip_ratio_c=3.0"],
        ),
        (
            {"algorithm": {"policy_loss": "grpo"}},
            ["algorithm.policy_loss: got 'grpo'", "'cispo'"],
        ),
        ({"algorithm": {"lr": float("nan")}}, ["algorithm.lr: got nan"]),
        ({"scheduler": {"events_port": 65536}}, ["scheduler.events_port: got 65536", "0..65535"]),
        ({"pipeline": {"workers": {"train": -1}}}, ["pipeline.workers.train: got -1", ">= 0"]),
        ({"scheduler": {"resources": {"gpu": 0}}}, ["scheduler.resources.gpu: got 0", ">= 1"]),
        # bad choices
        (
            {"algorithm": {"estimator": "ppo"}},
            ["algorithm.estimator: got 'ppo'; allowed: one of 'grpo', 'dr_grpo'"],
        ),
        ({"algorithm": {"ratio": "group"}}, ["algorithm.ratio: got 'group'", "'sequence'"]),
        ({"algorithm": {"gamma": 1.5}}, ["algorithm.gamma: got 1.5", "0..1"]),
        ({"algorithm": {"lam": -0.5}}, ["algorithm.lam: got -0.5", "0..1"]),
        ({"logging": {"level": 3}}, ["logging.level: got 3 (int)", "'debug'"]),
        ({"scheduler": {"curve": True}}, ["scheduler.curve: got True (bool)", "quote"]),
        # cross-field
        (
            {"scheduler": {"control_port": 7000, "events_port": 7000}},
            ["scheduler.events_port: got 7000", "control_port"],
        ),
        (
            {"algorithm": {"estimator": "rloo"}, "data": {"group_size": 1}},
            ["algorithm.estimator: got 'rloo' with data.group_size=1", ">= 2"],
        ),
    ],
)
def test_bad_values_name_key_value_and_allowed(data: dict[str, Any], expected: list[str]) -> None:
    message = error_of(data)
    for part in expected:
        assert part in message, message


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("pipeline.max_staleness", ["'pipeline.max_staleness'", "no '='"]),
        ("=3", ["'=3'", "empty key"]),
        ("pipeline..max_staleness=3", ["empty key"]),
        ("scheduler.resources={gpu: 2", ["'scheduler.resources={gpu: 2'", "not valid YAML"]),
        ("pipeline.max_staleness=-2", ["pipeline.max_staleness: got -2"]),
        ("pipeline.nope=1", ["pipeline.nope: unknown key"]),
        ("run.name.first=x", ["'run.name.first=x'", "run.name is 'demo', not a mapping"]),
        ("scheduler.curve=on", ["scheduler.curve: got True (bool)"]),
    ],
)
def test_bad_overrides(override: str, expected: list[str]) -> None:
    message = error_of({"run": {"name": "demo"}}, (override,))
    for part in expected:
        assert part in message, message


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_config(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_yaml_syntax_error_names_path_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\n  name: demo\npipeline:\n  max_staleness: [1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message and "invalid YAML" in message
    assert "line 5" in message, message
    assert "\n" not in message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "- run\n- data\n"))
    message = str(info.value)
    assert str(tmp_path) in message and "mapping" in message and "['run', 'data']" in message


def test_error_from_file_names_the_dotted_key(tmp_path: Path) -> None:
    path = write(tmp_path, "algorithm:\n  kl_estimator: k2\n")
    with pytest.raises(ConfigError, match=r"algorithm\.kl_estimator: got 'k2'; allowed"):
        load_config(path)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------------- output and help


def test_round_trip_through_dump(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            "run.name=rt",
            "algorithm.lr=3e-6",
            "pipeline.workers.generate=4",
            "scheduler.resources={gpu: 2, nic: 1}",
            "scheduler.curve='off'",
            "logging.format=console",
        ],
    )
    path = write(tmp_path, dump_config(cfg))
    assert load_config(path) == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_config_to_dict_is_plain_builtins() -> None:
    data = config_to_dict(RunConfig())
    assert type(data) is dict and type(data["pipeline"]["workers"]) is dict
    assert data["run"] == {
        "name": "arithmetic",
        "dir": "runs/arithmetic",
        "seed": 0,
        "total_steps": 300,
        "keep_checkpoints": 3,
        "dump_rollouts": False,
    }
    yaml.safe_dump(data)  # raises on anything that is not a YAML builtin


def test_describe_fields_covers_every_leaf_with_help() -> None:
    rows = describe_fields()
    keys = [key for key, _, _ in rows]
    assert len(keys) == len(set(keys))
    assert all(help_text.split(" (allowed:")[0] for _, _, help_text in rows)
    described = {key: (default, text) for key, default, text in rows}
    assert described["pipeline.max_staleness"][0] == "2"
    assert "an integer >= 0" in described["pipeline.max_staleness"][1]
    assert described["run.dir"][0] == "runs/{name}"
    assert "one of 'grpo', 'dr_grpo'" in described["algorithm.estimator"][1]


def test_the_ppo_config_runs_a_critic_beside_the_policy() -> None:
    cfg = load_config(DEFAULT_YAML.with_name("ppo.yaml"))
    assert cfg.algorithm.estimator == "gae" and cfg.critic.warmup_steps == 5
    assert cfg.critic.layers == 2  # half the embedded policy's 4: the generator keeps its core
    roles = workers_to_start(cfg)
    # The critic's step makes the values (critic.values: step): no values workers, and
    # the train step reads the critic's result for them.
    assert roles["critic"] == 1 and "values" not in roles
    # The trainer's update reads the proximal log-probs from its own forward pass.
    assert cfg.algorithm.proximal_logp == "trainer" and "logp" not in roles
    table = pipeline_for(cfg)
    rows = {s.role: (s.source.value, s.target.value) for s in table.stages}
    assert rows["critic"] == ("ready", "critic_trained") and "values" not in rows
    assert "critic" in (table.gated(Gate.STEP).reads or ())
    assert "values" not in workers_to_start(load_config(None))  # GRPO runs no critic
    # With a values stage of their own: a branch beside logp, which the train step reads.
    staged = load_config(DEFAULT_YAML.with_name("ppo.yaml"), ["critic.values=stage"])
    assert workers_to_start(staged)["values"] == 1
    rows = {s.role: (s.source.value, s.target.value) for s in pipeline_for(staged).stages}
    assert rows["values"] == ("generated", "ready")
    assert "values" in (pipeline_for(staged).gated(Gate.STEP).reads or ())


def test_proximal_logprobs_from_the_trainer_run_no_logp_stage() -> None:
    cfg = load_config(None, ["algorithm.proximal_logp=trainer"])
    table = pipeline_for(cfg)
    assert "logp" not in table.worker_roles and "logp" not in workers_to_start(cfg)
    assert "logp" not in (table.gated(Gate.STEP).reads or ())
    assert "logp" in workers_to_start(load_config(None))


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["algorithm.mini_batches=2"], r"one update per step \(algorithm\.mini_batches=2"),
        (["algorithm.epochs=2"], r"algorithm\.epochs=2"),
        (
            ["algorithm.correction.offpolicy.reject=token"],
            r"no rejection \(algorithm\.correction\.offpolicy\.reject=token",
        ),
        (["backends.generate=vllm"], r"backends\.generate=vllm"),
        (["model.generate_dtype=bfloat16"], r"model\.generate_dtype=bfloat16"),
    ],
)
def test_proximal_logprobs_from_the_trainer_name_what_they_need(
    overrides: list[str], named: str
) -> None:
    with pytest.raises(ValueError, match=r"algorithm\.proximal_logp: got 'trainer'.*" + named):
        load_config(None, ["algorithm.proximal_logp=trainer", *overrides])


def test_the_critic_may_run_as_a_group_of_ranks() -> None:
    cfg = load_config(None, ["algorithm.estimator=gae", "pipeline.workers.critic=2"])
    assert workers_to_start(cfg)["critic"] == 2


# ------------------------------------------------------------------------------ sampling


def test_sampling_truncation_defaults_off_and_is_set_by_key() -> None:
    assert (RunConfig().algorithm.top_p, RunConfig().algorithm.top_k) == (1.0, 0)
    cfg = config_from_dict({}, ("algorithm.top_p=0.9", "algorithm.top_k=50"))
    assert (cfg.algorithm.top_p, cfg.algorithm.top_k) == (0.9, 50)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.top_p=0", "algorithm.top_p"),
        ("algorithm.top_p=1.5", "algorithm.top_p"),
        ("algorithm.top_p=-0.1", "algorithm.top_p"),
        ("algorithm.top_k=-1", "algorithm.top_k"),
        ("algorithm.top_k=2.5", "algorithm.top_k"),
    ],
)
def test_sampling_truncation_out_of_bounds_is_refused_by_key(override: str, key: str) -> None:
    message = error_of(overrides=(override,))
    assert key in message and override.split("=")[1] in message


def test_min_p_and_stop_default_off_and_are_set_by_key() -> None:
    assert (RunConfig().algorithm.min_p, RunConfig().algorithm.stop) == (0.0, [])
    cfg = config_from_dict({}, ("algorithm.min_p=0.05", "algorithm.stop=</answer>"))
    assert (cfg.algorithm.min_p, cfg.algorithm.stop) == (0.05, ["</answer>"])
    cfg = config_from_dict({"algorithm": {"stop": ["</answer>", "\n\n"]}})
    assert cfg.algorithm.stop == ["</answer>", "\n\n"]


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ({"min_p": 1}, r"algorithm\.min_p: got 1\.0; allowed: a number in \[0, 1\)"),
        ({"min_p": -0.1}, r"algorithm\.min_p: got -0\.1; allowed: a number >= 0"),
        ({"min_p": "a lot"}, r"algorithm\.min_p: got 'a lot' \(str\)"),
        (
            {"stop": ["</answer>", ""]},
            r"algorithm\.stop: got \['</answer>', ''\]; allowed: non-empty",
        ),
        ({"stop": [3]}, r"algorithm\.stop\[0\]: got 3 \(int\)"),
    ],
)
def test_a_bad_min_p_or_stop_is_refused_by_key(algorithm: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_dict({"algorithm": algorithm})


def test_lora_with_vllm_generating_is_allowed_and_a_rank_past_vllms_refused() -> None:
    lora = {"rank": 16, "target_modules": ["q_proj"]}
    cfg = config_from_dict({"model": {"lora": lora}, "backends": {"generate": "vllm"}})
    assert cfg.model.lora.enabled and cfg.backends.generate == "vllm"
    with pytest.raises(ValueError, match=r"model\.lora\.rank: got 1024 .* up to 512"):
        config_from_dict(
            {"model": {"lora": lora | {"rank": 1024}}, "backends": {"generate": "vllm"}}
        )
    with pytest.raises(ValueError, match=r"backends\.generate .torch. or .vllm. with adapters"):
        config_from_dict({"model": {"lora": lora}, "backends": {"generate": "sglang"}})


def test_the_dapo_config_is_the_recipe_and_punishes_no_right_answer() -> None:
    from asyncrl.actors.tasks.arithmetic import solution

    cfg = load_config(DEFAULT_YAML.with_name("dapo.yaml"))
    a = cfg.algorithm
    assert a.filter_groups.enabled and a.filter_groups.metric == "task"
    assert (a.clip_low, a.clip_high, a.loss_agg, a.kl_coef) == (0.2, 0.28, "token", 0.0)
    assert "ref_logp" not in workers_to_start(cfg)
    # The longest right answer of the embedded task (six columns, a seven-digit sum and the
    # end token) stays short of the punished tail.
    longest_right = len(solution(999_999, 999_999)) + 1
    assert longest_right <= cfg.model.max_new_tokens - a.overlong_buffer < cfg.model.max_new_tokens


@pytest.mark.parametrize(
    ("overrides", "train", "critic"),
    [
        ((), 1, 1),
        (("pipeline.workers.train=2",), 2, 1),
        (("pipeline.workers.train=4", "pipeline.workers.critic=2"), 4, 2),
        (("pipeline.workers.train=2", "weights.from_every_rank=false"), 1, 1),
        (("pipeline.workers.train=2", "model.lora.rank=8"), 1, 1),
        (("pipeline.workers.train=2", "backends.train=megatron"), 1, 1),
        (
            (
                "pipeline.workers.train=4",
                "backends.train=megatron",
                "backends.megatron.tensor_parallel=2",
            ),
            2,
            1,
        ),
        (
            (
                "pipeline.workers.train=4",
                "backends.train=megatron",
                "backends.megatron.tensor_parallel=2",
                "backends.megatron.pipeline_parallel=2",
            ),
            4,
            1,
        ),
        (
            (
                "pipeline.workers.train=4",
                "backends.train=megatron",
                "backends.megatron.expert_parallel=2",
            ),
            2,
            1,
        ),
    ],
)
def test_a_version_comes_in_parts_from_a_group_that_can_publish_them(
    overrides: tuple[str, ...], train: int, critic: int
) -> None:
    """Every worker reads how a learner's versions come from the config alone: the
    publisher and its receivers agree without a word."""
    cfg = config_from_dict({}, overrides)
    assert (cfg.weight_parts("train"), cfg.weight_parts("critic")) == (train, critic)
