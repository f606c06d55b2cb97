"""The config's placement, as the nodes a cluster runs (runtime/launch/clusters/node_plan.py) and as
Slurm's batch script (runtime/launch/clusters/slurm.py); nothing is submitted."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from asyncrl.runtime.contract.config import ConfigError, config_from_dict
from asyncrl.runtime.launch.clusters.node_plan import cluster_nodes
from asyncrl.runtime.launch.clusters.slurm import render_sbatch

NODE = ["/venv/bin/python", "-m", "asyncrl.runtime.launch.cli.main", "node", "-c", "/r/run.yaml"]
HEAD = {"scheduler": 1, "dataloader": 1, "reward": 1, "train": 2, "logp": 1}


def _cfg(nodes: list[dict[str, Any]], **more: Any) -> Any:
    return config_from_dict({
        "run": {"dir": "/shared/runs/a"},
        "scheduler": {"host": "0.0.0.0"},
        "pipeline": {"workers": {"train": 2}},
        "backends": {"device": "cuda"},
        "placement": {"nodes": nodes, **more},
    })  # fmt: skip


def test_each_node_runs_its_groups_roles_the_scheduler_first_generators_numbered_on() -> None:
    cfg = _cfg([{"roles": HEAD}, {"count": 2, "roles": {"generate": 4}}])
    shares = cluster_nodes(cfg)
    assert [s.roles_arg() for s in shares] == [
        "scheduler,dataloader=1,reward=1,train=2,logp=1", "generate=4", "generate=4"
    ]  # fmt: skip
    assert [s.first_index for s in shares] == [0, 0, 4]
    # A GPU per GPU worker unless the group says: train's 2 ranks and logp; 4 generators.
    assert [s.gpus for s in shares] == [3, 4, 4]


def test_a_group_on_several_nodes_is_split_by_rank_in_the_order_of_the_nodes() -> None:
    head = {**HEAD, "train": 1}
    cfg = _cfg([{"roles": head}, {"count": 1, "roles": {"generate": 2, "train": 1}}])
    assert [s.roles_arg() for s in cluster_nodes(cfg)] == [
        "scheduler,dataloader=1,reward=1,train@0,logp=1", "generate=2,train@1"
    ]  # fmt: skip
    four = config_from_dict({
        "scheduler": {"host": "0.0.0.0"},
        "pipeline": {"workers": {"train": 4}},
        "placement": {"nodes": [{"roles": {**head, "train": 2}},
                                {"count": 2, "roles": {"generate": 1, "train": 1}}]},
    })  # fmt: skip
    assert [s.roles_arg().rpartition(",")[2] for s in cluster_nodes(four)] == [
        "logp=1", "train@2", "train@3"
    ]  # fmt: skip
    assert [s.first_ranks for s in cluster_nodes(four)] == [{"train": 0}, {"train": 2},
                                                            {"train": 3}]  # fmt: skip


def test_no_placement_is_one_node_running_the_whole_run() -> None:
    (share,) = cluster_nodes(config_from_dict({}))
    assert share.scheduler and share.roles_arg().startswith("scheduler,dataloader=1")
    assert share.gpus == 0  # a run on CPU asks for none


def test_the_script_runs_the_scheduler_on_the_batch_host_and_one_srun_step_per_node() -> None:
    cfg = _cfg([{"roles": HEAD, "gpus": 2}, {"count": 2, "roles": {"generate": 2}}],
               sbatch=["--partition=gpu"])  # fmt: skip
    script = render_sbatch(cfg, NODE, Path("/work"))
    lines = script.splitlines()
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --gres=gpu:2",
                 "#SBATCH --requeue", "#SBATCH --partition=gpu", "#SBATCH --chdir=/work",
                 "#SBATCH --output=/shared/runs/a/logs/slurm-%j.out",
                 "if [ -d /shared/runs/a/journal ]; then resume=(--resume); fi"):  # fmt: skip
        assert line in lines, script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    runs = [line for line in lines if '"${node[@]}"' in line and not line.startswith("node=")]
    assert runs[0].startswith('"${node[@]}" --roles scheduler,') and "--resume" not in runs[0]
    assert '"${resume[@]}"' in runs[0]
    assert [r.split("--relative=")[1].split()[0] for r in runs[1:]] == ["1", "2"]
    assert all("--gres=gpu:2" in r and "--first-index" in r for r in runs[1:])
    assert runs[2].endswith("--roles generate=2 --first-index 2 & pids+=($!)")


def test_the_script_is_valid_bash() -> None:
    cfg = _cfg([{"roles": HEAD}, {"roles": {"generate": 1}}])
    subprocess.run(["bash", "-n"], input=render_sbatch(cfg, NODE, Path("/w")), text=True,
                   check=True)  # fmt: skip


@pytest.mark.parametrize("key", ["name", "dir"])
def test_a_line_break_in_the_runs_name_or_dir_is_refused_naming_the_key(key: str) -> None:
    # It would have ended the #SBATCH lines (sbatch reads them up to the first command)
    # and run the rest of the value as shell on the batch host.
    with pytest.raises(ConfigError, match=rf"^run\.{key}: got .*\\n.*; allowed: a string on"):
        config_from_dict({"run": {key: "a\ntouch /tmp/injected"}})


def test_the_script_refuses_a_working_directory_on_two_lines() -> None:
    cfg = _cfg([{"roles": HEAD}, {"roles": {"generate": 1}}])
    with pytest.raises(ValueError, match=r"^the working directory \(--chdir\): got '/w\\n"):
        render_sbatch(cfg, NODE, Path("/w\nid"))


def test_shell_in_the_runs_name_stays_quoted_and_every_option_is_read() -> None:
    cfg = config_from_dict({"run": {"name": "a'; id $(id) #", "dir": "/r/{name}"},
                            "placement": {"sbatch": ["--time=1:00:00"]}})  # fmt: skip
    script = render_sbatch(cfg, NODE, Path("/w"))
    head = script.split("\n\n")[0].splitlines()
    assert all(line.startswith("#") for line in head) and "#SBATCH --time=1:00:00" in head
    assert "# 'a'\"'\"'; id $(id) #' over 1 node(s)" in head[1]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.parametrize(
    ("nodes", "more", "error"),
    [
        ([{"roles": {"generate": 1}}], {}, "placement.nodes: got the scheduler in no group"),
        ([{"roles": HEAD}, {"roles": {"scheduler": 1}}], {},
         "placement.nodes: got the scheduler in groups [0, 1]"),
        ([{"count": 2, "roles": HEAD}], {}, "placement.nodes[0].count: got 2 with the scheduler"),
        ([{"roles": {"scheduler": 1, "genrate": 1}}], {},
         "unknown key; did you mean 'generate'?"),
        ([{"roles": {}}], {}, "placement.nodes[0].roles: got none"),
        ([{"roles": HEAD}], {"sbatch": ["-p gpu"]}, "placement.sbatch: got '-p gpu'"),
    ],
)  # fmt: skip
def test_a_bad_placement_is_refused_on_load_with_one_line(nodes: Any, more: Any,
                                                         error: str) -> None:  # fmt: skip
    with pytest.raises(ConfigError, match=None) as raised:
        _cfg(nodes, **more)
    assert error in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("nodes", "error"),
    [
        ([{"roles": {"scheduler": 1, "dataloader": 1, "reward": 1, "train": 2}}],
         "placement.nodes: no node runs generate, logp"),
        ([{"roles": {**HEAD, "train": 1}}, {"roles": {"generate": 1}}],
         "placement.nodes: 1 rank(s) of train placed over its nodes; allowed: 2 in all"),
        ([{"roles": HEAD}, {"count": 2, "roles": {"generate": 1, "logp": 1}}],
         "placement.nodes[1].roles.logp: got 1 on 2 node(s), beyond the group's 1 rank(s)"),
        ([{"roles": HEAD}, {"count": 2, "roles": {"generate": 1, "train": 1}}],
         "placement.nodes[1].roles.train: got 1 on 2 node(s), beyond the group's 2 rank(s) "
         "(pipeline.workers.train) with 2 placed before"),
        ([{"roles": {**HEAD, "ref_logp": 1}}, {"roles": {"generate": 1}}],
         "placement.nodes[0].roles.ref_logp: ref_logp has no work in this run"),
    ],
)  # fmt: skip
def test_a_placement_the_run_cannot_go_by_is_refused_with_one_line(nodes: Any,
                                                                   error: str) -> None:  # fmt: skip
    with pytest.raises(ValueError) as raised:
        cluster_nodes(_cfg(nodes))
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_a_loopback_scheduler_on_several_nodes_is_refused() -> None:
    cfg = config_from_dict({
        "placement": {"nodes": [{"roles": {"scheduler": 1, "dataloader": 1, "reward": 1,
                                           "train": 1, "logp": 1}},
                                {"roles": {"generate": 1}}]},
    })  # fmt: skip
    with pytest.raises(ValueError, match=r"scheduler.host: got 127.0.0.1, loopback"):
        cluster_nodes(cfg)
