"""``asyncrl launch --on ray`` on a real Ray cluster: ``ray.cluster_utils.Cluster``, a head
and two nodes on this machine (each its own raylet and object store), the nodes with two
fake GPUs each. The default run is launched over it as a user would, every process an
actor; the generator's actor asks for the two GPUs of a node."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import free_port, listening_port, processes_mentioning
from tests.support.gated_roles import GATE
from tests.support.host_run import check_exactly_once, lines

ray = pytest.importorskip("ray", reason="the Ray tests need Ray: pip install 'asyncrl[ray]'")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

GENERATOR = "generate-ray-0"
PLACEMENT = (
    "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 1, logp: 1}}, "
    "{roles: {generate: 1}, gpus: 2}]"
)
# Small nodes, as the machine running the tests is small; a lost node is noticed in
# about 1.5 s (Ray's default takes 30 s).
NODE = {"num_cpus": 1, "num_gpus": 2, "object_store_memory": 80 * 2**20}
HEAD = {
    "num_cpus": 1,
    "num_gpus": 0,
    "object_store_memory": 80 * 2**20,
    "include_dashboard": False,
    "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
}


@pytest.fixture
def cluster() -> Iterator[Any]:
    """A head without GPUs and two nodes with two fake GPUs each."""
    made = cluster_utils.Cluster(initialize_head=True, head_node_args=HEAD)
    try:
        for _ in range(2):
            made.add_node(**NODE)
        made.wait_for_nodes()
        yield made
    finally:
        # A launcher a failed test left running would wait on a cluster that is gone.
        for pid in processes_mentioning(f"launch --on ray --address {made.address} "):
            os.kill(pid, signal.SIGKILL)
        made.shutdown()


def _launch(cluster: Any, root: Path, steps: int, *more: str) -> tuple[subprocess.Popen, Path]:
    """``asyncrl launch --on ray`` with the default run; the launcher and the run dir."""
    run_dir = root / "run"
    # Ports a restarted scheduler gets again: not the kernel's ephemeral ones, which any
    # of Ray's own connections may take while the scheduler is down.
    control, events = listening_port(), listening_port()
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "launch", "--on", "ray",
        "--address", cluster.address, "-c", str(Path("deploy/configs/default.yaml").resolve()),
        f"run.dir={run_dir}", f"run.total_steps={steps}", "scheduler.host=0.0.0.0",
        f"scheduler.control_port={control}", f"scheduler.events_port={events}",
        PLACEMENT, *more,
    ]  # fmt: skip
    output = (root / "launch.out").open("ab")  # a launch again goes on after the first
    return subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT), run_dir


def _wait(launcher: subprocess.Popen, root: Path, run_dir: Path, timeout_s: float) -> str:
    try:
        code = launcher.wait(timeout_s)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()
        tails = _tails(root, run_dir)
        raise AssertionError(f"the launch not over after {timeout_s:g} s\n{tails}") from None
    assert code == 0, f"launch exited {code}\n{_tails(root, run_dir)}"
    return (root / "launch.out").read_text(errors="replace")


def _tails(root: Path, run_dir: Path, chars: int = 2500) -> str:
    paths = [root / "launch.out", *sorted((run_dir / "logs").glob("*.log"))]
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                     for p in paths if p.exists())  # fmt: skip


def _starts(run_dir: Path, name: str) -> list[tuple[str, str]]:
    """(node, GPUs) of every start of the actor of ``name``, from its log."""
    text = (run_dir / "logs" / f"{name}.log").read_text(errors="replace")
    return re.findall(rf"asyncrl ray: {name}: starting on node (\w+) \([^)]*\), GPUs (\S+)", text)


def _no_actor_left(cluster: Any) -> None:
    """Every actor of the run ended with it: none holds a node's GPUs after the run."""
    ray.init(address=cluster.address)
    try:
        assert ray.util.list_named_actors(all_namespaces=True) == []
    finally:
        ray.shutdown()


# A trainer of two ranks that the placement puts on two nodes: Ray spreads its placement
# group's bundles strictly, and the ranks meet where rank 0 announces in the run directory.
SPLIT_TRAINER = [
    "pipeline.workers.train=2",
    "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 1, logp: 1}}, "
    "{roles: {generate: 1, train: 1}, gpus: 2}]",
]


@pytest.mark.parametrize("trainer", [[], SPLIT_TRAINER], ids=["one-rank", "split-over-nodes"])
def test_a_run_launched_on_ray_learns_and_finishes(
    cluster: Any, tmp_path: Path, trainer: list[str]
) -> None:
    steps = 20
    launcher, run_dir = _launch(cluster, tmp_path, steps, "data.val_every_versions=10", *trainer)
    output = _wait(launcher, tmp_path, run_dir, 300)
    assert "the run is finished (20 steps)" in output, output
    check_exactly_once(run_dir, steps)
    # The generator asked for a node's two GPUs: Ray gave it both of a node with GPUs.
    # (Split, it shares them with the trainer's rank 1: one each.)
    ((node, gpus),) = _starts(run_dir, GENERATOR)
    assert gpus in (["0", "1"] if trainer else ["0,1"]), gpus
    assert not cluster.head_node.node_id.startswith(node), node
    assert _starts(run_dir, "train-0")[0][1] == "none"
    # The scheduler on the head node, whose address the workers keep.
    ((node, _),) = _starts(run_dir, "scheduler")
    assert cluster.head_node.node_id.startswith(node), node
    # It learns: the model of step 10 scores well above the untrained one. The last version
    # is validated only when the generator loads it before the run stops (timing decides).
    validation = lines(run_dir / "validation.jsonl")
    assert [v["version"] for v in validation] in ([0, 10], [0, 10, 20]), validation
    assert validation[1]["val_reward"] >= validation[0]["val_reward"] + 0.15, validation
    if trainer:  # both ranks in every step, each on a node of its own
        assert all(m.get("train_ranks") == 2 for m in lines(run_dir / "metrics.jsonl"))
        ((rank_0, _),), ((rank_1, _),) = _starts(run_dir, "train-0"), _starts(run_dir, "train-1")
        assert rank_0 != rank_1, (rank_0, rank_1)
    _no_actor_left(cluster)


def test_a_node_removed_mid_run_its_workers_come_back_elsewhere_exactly_once(
    cluster: Any, tmp_path: Path
) -> None:
    steps = 30
    launcher, run_dir = _launch(cluster, tmp_path, steps)
    _wait_for_steps(launcher, tmp_path, run_dir, 5)
    ((node, _),) = _starts(run_dir, GENERATOR)
    (lost,) = [n for n in cluster.worker_nodes if n.node_id.startswith(node)]
    # The generator's node dies: its raylet and every process on it, at once.
    cluster.remove_node(lost, allow_graceful=False)
    cluster.add_node(**NODE)  # the cluster gets a node back, as an autoscaler would
    output = _wait(launcher, tmp_path, run_dir, 300)
    assert f"the run is finished ({steps} steps)" in output, output
    # Ray placed the generator again, on a node alive, with two GPUs again.
    starts = _starts(run_dir, GENERATOR)
    assert len(starts) >= 2 and all(n != node for n, _ in starts[1:]), starts
    assert all(gpus in ("0,1", "1,0") for _, gpus in starts), starts
    check_exactly_once(run_dir, steps)
    _no_actor_left(cluster)


def test_the_node_of_a_split_groups_rank_removed_the_group_meets_again_exactly_once(
    cluster: Any, tmp_path: Path
) -> None:
    steps = 20
    launcher, run_dir = _launch(cluster, tmp_path, steps, *SPLIT_TRAINER)
    _wait_for_steps(launcher, tmp_path, run_dir, 4)
    ((node, _),) = _starts(run_dir, "train-1")
    (lost,) = [n for n in cluster.worker_nodes if n.node_id.startswith(node)]
    cluster.remove_node(lost, allow_graceful=False)  # rank 1, and its staged state, gone
    cluster.add_node(**NODE)
    output = _wait(launcher, tmp_path, run_dir, 300)
    assert f"the run is finished ({steps} steps)" in output, output
    # Ray placed rank 1 again on a node alive, apart from rank 0 (STRICT_SPREAD), and
    # rank 0 started again to meet it.
    member, leader = _starts(run_dir, "train-1"), _starts(run_dir, "train-0")
    assert len(member) >= 2 and member[-1][0] != node, member
    assert len(leader) >= 2 and leader[-1][0] != member[-1][0], (leader, member)
    check_exactly_once(run_dir, steps)
    _no_actor_left(cluster)


def test_a_rank_and_the_scheduler_killed_ray_starts_them_again_and_the_run_ends_exactly(
    cluster: Any, tmp_path: Path
) -> None:
    steps = 16
    placement = (
        "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 2, logp: 1, "
        "generate: 1}, gpus: 4}]"
    )
    launcher, run_dir = _launch(cluster, tmp_path, steps, "pipeline.workers.train=2", placement)
    _wait_for_steps(launcher, tmp_path, run_dir, 3)
    # Rank 1's process dies: its group cannot go on without it, and Ray starts both ranks.
    os.kill(_pid_of(run_dir, "--role train --index 1 "), signal.SIGKILL)
    _wait_for_steps(launcher, tmp_path, run_dir, 7)
    # The scheduler's process dies: Ray starts its actor again, which resumes the journal.
    os.kill(_pid_of(run_dir, "asyncrl.runtime.scheduler.cli start "), signal.SIGKILL)
    output = _wait(launcher, tmp_path, run_dir, 300)
    assert f"the run is finished ({steps} steps)" in output, output
    leader, member = _starts(run_dir, "train-0"), _starts(run_dir, "train-1")
    assert len(leader) == 2 and len(member) == 2, (leader, member)
    # Each start of the group on one node (STRICT_PACK), each rank with a GPU of its own.
    for (node0, gpu0), (node1, gpu1) in zip(leader, member, strict=True):
        assert node0 == node1 and {gpu0, gpu1} == {"0", "1"}, (leader, member)
    log = (run_dir / "logs" / "scheduler.log").read_text(errors="replace")
    assert log.count("asyncrl ray: scheduler: starting on node") == 2, log
    assert "(resuming from the journal)" in log, log
    check_exactly_once(run_dir, steps)
    _no_actor_left(cluster)


def _wait_for_steps(launcher: subprocess.Popen, root: Path, run_dir: Path, steps: int) -> None:
    deadline = time.monotonic() + 180
    while len(lines(run_dir / "metrics.jsonl")) < steps:
        assert launcher.poll() is None and time.monotonic() < deadline, _tails(root, run_dir)
        time.sleep(0.5)


def _wait_for_output(launcher: subprocess.Popen, root: Path, run_dir: Path, text: str) -> None:
    deadline = time.monotonic() + 180
    while text not in (root / "launch.out").read_text(errors="replace"):
        assert launcher.poll() is None and time.monotonic() < deadline, _tails(root, run_dir)
        time.sleep(0.2)


def _pid_of(run_dir: Path, command: str) -> int:
    """The pid of this run's process whose command line has ``command``."""
    (pid,) = set(processes_mentioning(command)) & set(processes_mentioning(f"run.dir={run_dir}"))
    return pid


def test_the_run_outlives_its_launcher_ctrl_c_stops_it_and_a_new_launch_resumes_it(
    cluster: Any, tmp_path: Path
) -> None:
    # Its reward worker holds while the gate file is there: the Ctrl-C lands mid-run
    # however fast the machine trains (a run left to itself could end before it).
    steps, gated = 12, ("data.val_every_versions=0", "pipeline.actors=tests.support.gated_roles")
    first, run_dir = _launch(cluster, tmp_path, steps, *gated)
    _wait_for_steps(first, tmp_path, run_dir, 3)
    first.kill()  # the launcher only: the actors are detached, the run goes on
    first.wait()
    (run_dir / GATE).touch()
    second, _ = _launch(cluster, tmp_path, steps, *gated)
    # Ctrl-C once the second launcher follows the run: before that (importing Ray,
    # connecting) it has nothing to stop and dies of the signal, as any command would.
    _wait_for_output(second, tmp_path, run_dir, "the run goes on already: following its actors")
    second.send_signal(signal.SIGINT)  # Ctrl-C: the run stops, every actor killed
    assert second.wait(60) == 130, _tails(tmp_path, run_dir)
    _no_actor_left(cluster)
    stopped_at = len(lines(run_dir / "metrics.jsonl"))
    assert 3 <= stopped_at < steps, stopped_at
    (run_dir / GATE).unlink()
    third, _ = _launch(cluster, tmp_path, steps, *gated)
    output = _wait(third, tmp_path, run_dir, 300)
    assert f"the run is finished ({steps} steps)" in output, output
    # One scheduler ran until the Ctrl-C (the second launch found the first's actors), and
    # the third launch's resumed from the journal.
    log = (run_dir / "logs" / "scheduler.log").read_text(errors="replace")
    starts = re.findall(r"asyncrl ray: scheduler: starting on node .*", log)
    assert len(starts) == 2 and starts[1].endswith("(resuming from the journal)"), starts
    assert output.count("asyncrl launch: the run goes on already: following its actors") == 1
    assert "stopped: every actor killed; launch again to resume from the journal" in output
    check_exactly_once(run_dir, steps)
    _no_actor_left(cluster)


def test_no_cluster_at_the_address_given_is_one_line(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "launch", "--on", "ray",
        "--address", f"127.0.0.1:{free_port()}", f"run.dir={tmp_path / 'run'}",
        "scheduler.host=0.0.0.0",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("asyncrl: error: no Ray cluster at 127.0.0.1:"), line
    assert "start one (ray start --head)" in line, line


def test_a_worker_failing_on_every_start_stops_the_run_with_its_reason(
    cluster: Any, tmp_path: Path
) -> None:
    # Its reward worker fails at every start, as a plug-in whose service is down.
    launcher, run_dir = _launch(cluster, tmp_path, 5, "pipeline.actors=tests.support.failing_roles")
    try:
        code = launcher.wait(240)
    finally:
        launcher.kill()
    output = (tmp_path / "launch.out").read_text(errors="replace")
    assert code == 1, f"{code}\n{_tails(tmp_path, run_dir)}"
    reason = "reward-ray-0 fails on every start (3 in a row): on_start failed: "
    assert f"asyncrl launch: {reason}ConnectionRefusedError: the reward model's" in output, output
    assert f"its log: {run_dir / 'logs' / 'reward-ray-0.log'}" in output, output
    _no_actor_left(cluster)
