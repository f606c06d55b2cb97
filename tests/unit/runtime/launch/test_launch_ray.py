"""``asyncrl launch --on ray``: the plan of actors (pure, no Ray needed) and its one-line
refusals; the run itself on a Ray cluster is tests/integration/test_ray_run.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.runtime.contract.gangs import ENV_ADDR, ENV_RANK, ENV_SIZE
from asyncrl.runtime.launch.clusters.ray_plan import describe_plan, ray_plan

PYTHON = "/opt/env/bin/python"
HOST = "scheduler.host=0.0.0.0"
TWO_NODES = (
    "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 2, logp: 1}, "
    "gpus: 3}, {count: 2, roles: {generate: 2}, gpus: 2}]"
)


def _plan(tmp_path: Path, *overrides: str):
    return ray_plan(None, [HOST, *overrides], tmp_path, PYTHON)


def test_every_process_is_an_actor_named_by_the_run_the_scheduler_first(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "pipeline.workers.train=2", TWO_NODES)
    names = [p.name for p in plan.processes]
    assert names == [
        "scheduler", "dataloader-ray-0", "reward-ray-0", "train-0", "train-1", "logp-0",
        "generate-ray-0", "generate-ray-1", "generate-ray-2", "generate-ray-3",
    ]  # fmt: skip
    scheduler = plan.processes[0]
    assert scheduler.scheduler and scheduler.resume_argv is not None
    assert scheduler.resume_argv[-1] == "--resume" and "--resume" not in scheduler.argv
    # Every command names the run directory absolute (Ray's actors work elsewhere) and the
    # Python the launcher was told of.
    run_dir = f"run.dir={tmp_path / 'runs' / 'arithmetic'}"
    assert all(p.argv[0] == PYTHON and run_dir in p.argv for p in plan.processes)
    assert plan.run_dir == tmp_path / "runs" / "arithmetic" and plan.cwd == tmp_path


def test_gpus_are_shared_by_each_node_groups_gpu_workers(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "pipeline.workers.train=2", TWO_NODES)
    gpus = {p.name: p.num_gpus for p in plan.processes}
    # The first group's 3 over train's two ranks and logp; each generator node's 2 over
    # its two generators; CPU roles and the scheduler none.
    assert gpus["train-0"] == gpus["train-1"] == gpus["logp-0"] == 1.0
    assert {gpus[f"generate-ray-{i}"] for i in range(4)} == {1.0}
    assert gpus["scheduler"] == gpus["dataloader-ray-0"] == gpus["reward-ray-0"] == 0.0


def test_a_run_on_cpu_asks_for_no_gpu_unless_its_placement_gives_some(tmp_path: Path) -> None:
    assert {p.num_gpus for p in _plan(tmp_path).processes} == {0.0}
    plan = _plan(tmp_path, "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, "
                 "train: 1, logp: 1}}, {roles: {generate: 1}, gpus: 2}]")  # fmt: skip
    assert {p.name: p.num_gpus for p in plan.processes if p.num_gpus} == {"generate-ray-0": 2.0}


def test_a_training_group_is_one_placement_group_of_a_bundle_per_rank(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "pipeline.workers.train=2", TWO_NODES)
    assert dict(plan.gangs) == {"train": (1.0, 2)}
    assert plan.bundles("train") == [{"GPU": 1.0}, {"GPU": 1.0}]
    ranks = [p for p in plan.processes if p.gang == "train"]
    assert [(p.rank, p.env[ENV_RANK], p.env[ENV_SIZE]) for p in ranks] == [
        (0, "0", "2"),
        (1, "1", "2"),
    ]
    # On CPU a bundle still holds something, so that the ranks are packed together.
    assert _plan(tmp_path, "pipeline.workers.train=2").bundles("train") == [{"CPU": 0.01}] * 2
    text = describe_plan(plan)
    assert "placement group train (2 ranks): STRICT_PACK, {'GPU': 1.0}, {'GPU': 1.0}" in text
    assert "actor train-1: num_gpus=1 in placement group train bundle 1" in text


def test_a_group_split_over_nodes_is_one_bundle_per_node_spread_strictly(tmp_path: Path) -> None:
    split = "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 2, " \
        "logp: 1}}, {count: 2, roles: {generate: 1, train: 1}}]"  # fmt: skip
    plan = _plan(tmp_path, "pipeline.workers.train=4", split)
    assert plan.split == {"train": (2, 1, 1)} and plan.strategy("train") == "STRICT_SPREAD"
    assert plan.bundles("train") == [{"CPU": 0.02}, {"CPU": 0.01}, {"CPU": 0.01}]
    ranks = [p for p in plan.processes if p.gang == "train"]
    assert [(p.name, p.bundle, p.env[ENV_RANK], p.env[ENV_SIZE]) for p in ranks] == [
        ("train-0", 0, "0", "4"), ("train-1", 0, "1", "4"),
        ("train-2", 1, "2", "4"), ("train-3", 2, "3", "4"),
    ]  # fmt: skip
    # No address given: rank 0 announces where it listens in the run directory.
    assert all(ENV_ADDR not in p.env for p in ranks)
    assert "actor train-3: num_gpus=0 in placement group train bundle 2" in describe_plan(plan)
    # A node group's GPUs go to its own ranks: rank 1 beside the generator gets one.
    gpus = "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 1, " \
        "logp: 1}}, {roles: {generate: 1, train: 1}, gpus: 2}]"  # fmt: skip
    plan = _plan(tmp_path, "pipeline.workers.train=2", gpus)
    assert {p.name: p.num_gpus for p in plan.processes if p.num_gpus} == {
        "generate-ray-0": 1.0, "train-1": 1.0
    }  # fmt: skip
    assert plan.bundles("train") == [{"CPU": 0.01}, {"GPU": 1.0}]


def test_runs_ray_cannot_place_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"scheduler.host: got 127.0.0.1, loopback"):
        ray_plan(None, [], tmp_path, PYTHON)
    bad_split = "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 1, " \
        "logp: 1, generate: 2}, gpus: 5}]"  # fmt: skip
    with pytest.raises(ValueError, match=r"placement.nodes\[0\].gpus: got 5 for 4 GPU workers"):
        _plan(tmp_path, bad_split)


def test_the_dry_run_prints_the_actors_and_starts_nothing(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main",
        "launch", "--on", "ray", "--dry-run",
        f"run.dir={tmp_path / 'run'}", HOST, TWO_NODES, "pipeline.workers.train=2",
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.count("\nactor ") == 10 and "actor generate-ray-3: num_gpus=1\n" in out, out
    assert "once the journal exists: " in out and not (tmp_path / "run").exists()


def test_without_ray_the_launch_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl.runtime.launch.clusters.ray_launch import RayLaunchError, launch_on_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as on an install without the extra
    with pytest.raises(RayLaunchError, match=r"pip install 'asyncrl\[ray\]'"):
        launch_on_ray(_plan(tmp_path))


def test_a_ctrl_c_kills_a_held_follower_and_runs_the_stop_apart_from_it(tmp_path: Path) -> None:
    # The follower stands for a call of Ray's that holds its process after a Ctrl-C: it
    # ignores SIGINT and never returns. The launcher kills it and the stop runs apart.
    import os
    import signal
    import threading
    import time

    from asyncrl.runtime.launch.clusters.ray_launch import _apart_from_ray

    held, stopped = tmp_path / "held", tmp_path / "stopped"

    def follow() -> int:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        held.write_text(str(os.getpid()))
        while True:
            time.sleep(1)

    def stop() -> int:
        stopped.touch()
        return 0

    def interrupt() -> None:
        while not held.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, to the launcher

    threading.Thread(target=interrupt, daemon=True).start()
    assert _apart_from_ray(follow, stop, 10.0) == 130
    assert stopped.exists()
    follower = int(held.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(follower, 0)  # killed and reaped
    # Without a Ctrl-C the follower's own exit status is the launch's.
    assert _apart_from_ray(lambda: 3, stop, 10.0) == 3


# Ray's own errors: with the Ray tests, where the ray extra is installed (CI's cluster stage).
@pytest.mark.cluster
def test_a_rank_asks_again_while_rank_0_restarts_with_a_stand_in_for_rays_handles(
    tmp_path: Path,
) -> None:
    # A rank of a group that Ray starts again asks rank 0 where the group meets. Rank 0's
    # actor may not exist yet, then be restarting (Ray raises ActorUnavailableError): both
    # pass, and the rank asks again rather than ending its actor for good. A stand-in for
    # Ray's handles, since a real restart's timing cannot be forced; the errors are Ray's.
    import ray.exceptions

    from asyncrl.runtime.launch.clusters.ray_actor import ProcessActor

    plan = _plan(tmp_path, "pipeline.workers.train=2")
    answers: list[object] = [
        ValueError("no actor named train-0"),
        ray.exceptions.ActorUnavailableError("The actor is restarting", b"\0" * 16),
        None,  # started, its address not picked yet
        "127.0.0.1:4567",
    ]

    class Ray:
        exceptions = ray.exceptions

        def get_actor(self, name: str, namespace: str) -> object:
            assert name == "train-0" and namespace == plan.namespace
            if isinstance(answers[0], ValueError):
                raise answers.pop(0)  # type: ignore[misc]
            return Leader()

        def get(self, reference: object) -> object:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    class Leader:
        class address:  # Ray's handle spelling: leader.address.remote()
            @staticmethod
            def remote() -> str:
                return "reference"

    actor = ProcessActor.__new__(ProcessActor)
    actor._ray, actor._plan = Ray(), plan
    actor._process = next(p for p in plan.processes if p.name == "train-1")
    assert actor._gang_address() == "127.0.0.1:4567" and not answers
