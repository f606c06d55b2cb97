"""What one machine of a run starts (``asyncrl node`` and ``asyncrl run``): names, command
lines, keys, groups of ranks, and which worker gets which GPU; no process is started."""

from __future__ import annotations

import sys

import pytest

from asyncrl.runtime.contract.bus import dialable
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.gangs import ENV_ADDR, ENV_RANK, ENV_SIZE
from asyncrl.runtime.launch.gpus import (
    VISIBLE_ENV,
    gpu_roles,
    gpus_per_worker,
    hand_out,
    machine_gpus,
    parse_gpus,
    visible_gpus,
)
from asyncrl.runtime.launch.plan import NodePlan, node_specs, parse_roles
from asyncrl.transport.identity import worker_env

SECRET = b"s" * 32
ARGS = ["-c", "/runs/run.yaml", "run.total_steps=4"]


def test_asyncrl_run_starts_the_scheduler_then_every_role_named_role_index() -> None:
    cfg = config_from_dict({})
    specs = node_specs(cfg, ARGS, NodePlan.whole_run(cfg), resume=False, run_secret=SECRET)
    assert [s.name for s in specs] == [
        "scheduler",
        "dataloader-0",
        "generate-0",
        "logp-0",
        "reward-0",
        "train-0",
    ]
    scheduler = specs[0]
    assert not scheduler.restart and scheduler.argv[-1] == "--ipc"  # loopback: ipc:// only
    assert list(scheduler.resume_argv or ())[-2:] == ["--ipc", "--resume"]
    generate = specs[2]
    python = [sys.executable, "-m", "asyncrl.actors.cli"]
    assert generate.argv == [*python, "--role", "generate", "--index", "0", *ARGS]
    assert generate.env == worker_env(SECRET, "generate-0", "generate")


def test_a_node_names_its_workers_by_machine_and_runs_a_group_whole() -> None:
    cfg = config_from_dict({"pipeline": {"workers": {"train": 2}}})
    roles, scheduler, first_ranks = parse_roles("generate=2,reward,train", cfg)
    assert first_ranks == {}  # train given alone: the whole group, here
    plan = NodePlan(roles, scheduler, "gpu7", first_index=4, dial="tcp://10.0.0.5:5555")
    specs = {s.name: s for s in node_specs(cfg, ARGS, plan, resume=False, run_secret=SECRET)}
    assert list(specs) == [
        "generate-gpu7-4",
        "generate-gpu7-5",
        "reward-gpu7-4",
        "train-0",
        "train-1",
    ]
    generate = specs["generate-gpu7-5"]
    assert generate.argv[-len(ARGS) - 4 :] == [
        "--name",
        "generate-gpu7-5",
        "--scheduler",
        "tcp://10.0.0.5:5555",
        *ARGS,
    ]
    assert "--index" in generate.argv and generate.gang is None
    assert generate.env == worker_env(SECRET, "generate-gpu7-5", "generate")
    for rank in (0, 1):
        member = specs[f"train-{rank}"]
        assert member.gang == "train" and "--name" not in member.argv
        assert member.env is not None
        assert (member.env[ENV_RANK], member.env[ENV_SIZE]) == (str(rank), "2")
        assert not member.gang_across_machines  # its supervisor gives it its address


@pytest.mark.parametrize("text", ["train@1", "train@1-1"])
def test_a_node_runs_some_ranks_of_a_group_whose_leader_announces_where_it_meets(
    text: str,
) -> None:
    cfg = config_from_dict({"pipeline": {"workers": {"train": 2}}})
    asked = parse_roles(f"generate,{text}", cfg)
    assert asked.roles == {"generate": 1, "train": 1} and asked.first_ranks == {"train": 1}
    plan = NodePlan(asked.roles, node="b", first_ranks=asked.first_ranks)
    specs = {s.name: s for s in node_specs(cfg, ARGS, plan, resume=False, run_secret=SECRET)}
    assert list(specs) == ["generate-b-0", "train-1"]
    member = specs["train-1"]
    assert member.gang == "train" and member.gang_across_machines and member.env is not None
    assert (member.env[ENV_RANK], member.env[ENV_SIZE]) == ("1", "2")
    assert ENV_ADDR not in member.env  # it reads its leader's address in the run directory
    assert member.argv[member.argv.index("--index") + 1] == "1"
    # The whole group by ranks is the group whole: its supervisor gives it an address.
    assert parse_roles("train@0-1", cfg).first_ranks == {}


def test_the_critic_runs_as_one_group_of_ranks_like_the_trainer() -> None:
    cfg = config_from_dict(
        {
            "algorithm": {"estimator": "gae"},
            "critic": {"values": "stage"},
            "pipeline": {"workers": {"critic": 2}},
        }
    )
    specs = {s.name: s for s in node_specs(cfg, ARGS, NodePlan.whole_run(cfg), resume=False)}
    for rank in (0, 1):
        member = specs[f"critic-{rank}"]
        assert member.gang == "critic" and member.env is not None
        assert (member.env[ENV_RANK], member.env[ENV_SIZE]) == (str(rank), "2")
    assert specs["values-0"].gang is None  # its values workers stay independent
    with pytest.raises(ValueError, match="critic is one group of 2 ranks"):
        parse_roles("critic=1", cfg)


def test_a_node_with_the_scheduler_starts_it_first_resuming_if_asked() -> None:
    cfg = config_from_dict({"scheduler": {"host": "0.0.0.0"}})
    roles, scheduler, _ = parse_roles("scheduler,dataloader", cfg)
    assert scheduler and roles == {"dataloader": 1}
    specs = node_specs(cfg, ARGS, NodePlan(roles, True, "a"), resume=True)
    assert [s.name for s in specs] == ["scheduler", "dataloader-a-0"]
    assert specs[0].argv[-1] == "--resume" and "--ipc" not in specs[0].argv  # TCP for others
    assert specs[1].env is None  # no secret given: no key


@pytest.mark.parametrize(
    ("text", "overrides", "named"),
    [
        ("genrate=2", {}, ["'genrate'", "is no role", "generate"]),
        ("generate=0", {}, ["generate='0'", "1 or more"]),
        ("generate=two", {}, ["generate='two'"]),
        ("generate,generate=2", {}, ["generate is given twice"]),
        ("ref_logp", {}, ["'ref_logp' has no work in this run"]),
        ("train=1", {"pipeline": {"workers": {"train": 4}}}, ["train=1", "4 ranks", "train@R-S"]),
        ("generate@1", {}, ["generate@1", "only a group of ranks"]),
        ("train@2", {"pipeline": {"workers": {"train": 2}}}, ["train@2", "ranks 0 to 1"]),
        ("train@1-0", {"pipeline": {"workers": {"train": 2}}}, ["train@1-0", "ranks 0 to 1"]),
        ("train=1@1", {"pipeline": {"workers": {"train": 2}}}, ["train@1 or train=N"]),
        ("train@one", {"pipeline": {"workers": {"train": 2}}}, ["train@'one'", "R or R-S"]),
        ("logp=2", {}, ["logp=2", "one worker", "pipeline.workers.logp"]),
        ("scheduler=2", {}, ["one scheduler"]),
        ("dataloader", {"pipeline": {"workers": {"dataloader": 0}}}, ["no workers"]),
    ],
)
def test_bad_roles_are_one_line_naming_what_is_wrong(
    text: str, overrides: dict, named: list[str]
) -> None:
    with pytest.raises(ValueError) as caught:
        parse_roles(text, config_from_dict(overrides))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("--roles: ")
    for part in named:
        assert part in message, message


def test_a_role_alone_means_its_configured_count() -> None:
    cfg = config_from_dict({"pipeline": {"workers": {"generate": 3, "logp": 2}}})
    assert parse_roles("generate, logp", cfg) == ({"generate": 3, "logp": 2}, False, {})


def test_gpus_go_one_per_gpu_worker_and_around_again_when_short() -> None:
    workers = [
        ("dataloader-0", "dataloader"),
        ("generate-0", "generate"),
        ("generate-1", "generate"),
        ("train-0", "train"),
        ("reward-0", "reward"),
    ]
    roles = frozenset({"generate", "train"})
    assert hand_out(workers, roles, ["0", "1", "2"]) == {
        "generate-0": "0",
        "generate-1": "1",
        "train-0": "2",
    }
    assert hand_out(workers, roles, ["3", "5"]) == {
        "generate-0": "3",
        "generate-1": "5",
        "train-0": "3",
    }
    assert hand_out(workers, roles, []) == {}


def test_a_vllm_generator_split_over_gpus_gets_one_gpu_per_rank() -> None:
    workers = [("generate-0", "generate"), ("generate-1", "generate"), ("train-0", "train")]
    roles = frozenset({"generate", "train"})
    assert hand_out(workers, roles, ["0", "1", "2", "3", "4"], {"generate": 2}) == {
        "generate-0": "0,1",
        "generate-1": "2,3",
        "train-0": "4",
    }
    cfg = config_from_dict(
        {"backends": {"device": "cuda", "generate": "vllm", "vllm": {"tensor_parallel_size": 2}}}
    )
    assert gpus_per_worker(cfg) == {"generate": 2}
    assert gpus_per_worker(config_from_dict({"backends": {"device": "cuda"}})) == {}


def test_each_gpu_worker_sees_one_gpu_and_cpu_roles_none() -> None:
    cfg = config_from_dict({"backends": {"device": "cuda"}, "pipeline": {"workers": {"train": 2}}})
    plan = NodePlan({"dataloader": 1, "generate": 1, "train": 2}, node="a", gpus=("0", "1", "2"))
    specs = {s.name: s.env or {} for s in node_specs(cfg, ARGS, plan, resume=False)}
    seen = {name: env.get(VISIBLE_ENV) for name, env in specs.items()}
    assert seen == {"dataloader-a-0": None, "generate-a-0": "0", "train-0": "1", "train-1": "2"}
    on_cpu = config_from_dict({})  # GPUs on the machine, a run on CPU: nothing changes
    specs = {s.name: s.env or {} for s in node_specs(on_cpu, ARGS, plan, resume=False)}
    assert all(VISIBLE_ENV not in env for env in specs.values())


def test_which_roles_need_a_gpu() -> None:
    assert gpu_roles(config_from_dict({})) == frozenset()
    sglang = config_from_dict({"backends": {"generate": "sglang"}})
    assert gpu_roles(sglang) == {"generate"}
    cuda = config_from_dict({"backends": {"device": "cuda"}})
    assert gpu_roles(cuda) == {"generate", "train", "logp", "ref_logp", "critic", "values"}
    with pytest.raises(ValueError, match="computes on CPU"):
        machine_gpus(config_from_dict({}), "0,1")
    assert machine_gpus(cuda, "2,3") == ("2", "3")


@pytest.mark.parametrize(
    ("value", "gpus"),
    [
        ("0,1", ("0", "1")),
        ("", ()),
        ("-1", ()),
        ("2,-1,3", ("2",)),
        (" GPU-8f2c , 1", ("GPU-8f2c", "1")),
    ],
)
def test_the_gpus_cuda_visible_devices_gives(value: str, gpus: tuple[str, ...]) -> None:
    assert visible_gpus({VISIBLE_ENV: value}) == gpus


@pytest.mark.parametrize("text", ["", "0,,1", "0,0"])
def test_bad_gpus_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--gpus"):
        parse_gpus(text)


def test_a_scheduler_bound_to_every_interface_announces_an_address_to_dial() -> None:
    announced = dialable("tcp://0.0.0.0:5555")
    assert announced.startswith("tcp://") and announced.endswith(":5555")
    assert "0.0.0.0" not in announced
    for kept in ("tcp://10.1.2.3:5555", "tcp://127.0.0.1:9", "ipc:///run/x/control"):
        assert dialable(kept) == kept
