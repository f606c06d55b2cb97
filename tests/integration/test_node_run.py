"""``asyncrl node``: a run split over two machine supervisors, here two on one machine over
loopback TCP (the bus as between machines, plaintext on loopback), each restarting what
dies under it; and what a node refuses before it starts anything."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, processes_mentioning, wait_for

pytestmark = pytest.mark.timeout(240)

# The scheduler's machine: the scheduler, what feeds and scores groups, and the trainer.
FIRST = "scheduler,dataloader,reward,train"
# The other machine: what generates and scores rollouts.
SECOND = "generate,logp,ref_logp"


def cluster(tmp_path: Path, steps: int) -> Cluster:
    # TCP on loopback, as between machines; ports picked by the OS and announced.
    tcp = {"host": "127.0.0.1", "local_ipc": False}
    return Cluster(tmp_path, run={"total_steps": steps}, scheduler=tcp)


def node(c: Cluster, name: str, roles: str, *extra: str, work: str = "") -> subprocess.Popen:
    log = open(c.logs / f"node-{name}.log", "ab")  # noqa: SIM115 - the child owns it
    argv = [
        sys.executable,
        "-m",
        "asyncrl.runtime.launch.cli.main",
        "node",
        "-c",
        str(c.config_path),
    ]
    argv += ["--roles", roles, "--node", name, *extra]
    env = {**os.environ, "ASYNCRL_DEMO_WORK_S": work}  # the supervisor passes it on
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def pid_of(c: Cluster, name: str, child: str) -> int:
    found = re.findall(rf"started {child} \(pid (\d+)", c.log_text(f"node-{name}"))
    assert found, c.log_text(f"node-{name}")
    return int(found[-1])


def finish(c: Cluster, *nodes: subprocess.Popen) -> None:
    """Both nodes end by themselves, 0; nothing of the run is left running."""
    try:
        for proc, name in zip(nodes, ("a", "b"), strict=True):
            assert proc.wait(150) == 0, f"node {name}:\n{c.log_text(f'node-{name}')[-4000:]}"
    finally:
        for proc in nodes:
            if proc.poll() is None:  # stalled: nothing of it may outlive the test
                proc.send_signal(signal.SIGINT)
                proc.wait(30)
    c.check_exactly_once()
    assert wait_for(lambda: not processes_mentioning(str(c.config_path)), 10, "no process left")


def test_a_run_split_over_two_nodes_finishes_by_itself_exactly(tmp_path: Path) -> None:
    c = cluster(tmp_path, 8)
    first = node(c, "a", FIRST)
    second = node(c, "b", SECOND)
    finish(c, first, second)
    a, b = c.log_text("node-a"), c.log_text("node-b")
    assert "started scheduler" in a and "step 8/8" in a
    for child in ("generate-b-0", "logp-0", "ref_logp-0"):
        assert f"started {child} " in b, b
    assert "started dataloader-a-0" in a and "started reward-a-0" in a
    endpoints = [line for line in (c.run_dir / "logs" / "scheduler.log").read_text().splitlines()
                 if '"scheduler listening"' in line]  # fmt: skip
    assert '"control": "tcp://127.0.0.1:' in endpoints[0]  # TCP, not ipc://
    assert (c.run_dir / "finished.json").is_file()


def test_on_every_interface_the_bus_is_encrypted_with_keys_the_first_node_makes(
    tmp_path: Path,
) -> None:
    # As on several machines: the scheduler binds 0.0.0.0, so CURVE is on; nobody ran keygen.
    c = Cluster(tmp_path, run={"total_steps": 4}, scheduler={"host": "0.0.0.0"})
    first = node(c, "a", FIRST)
    second = node(c, "b", SECOND)
    wait_for(c.endpoints, 60, "the scheduler's endpoints")
    announced = c.endpoints()
    assert announced is not None and announced["curve"]
    assert "0.0.0.0" not in announced["control"]  # what another machine can dial
    finish(c, first, second)
    keys = c.run_dir / "keys"
    assert sorted(path.name for path in keys.iterdir()) == [
        "client.key", "client.key_secret", "server.key", "server.key_secret"
    ]  # fmt: skip
    assert all(path.stat().st_mode & 0o077 == 0 for path in keys.iterdir())
    assert "made CurveZMQ keys" in c.log_text("node-a")


def test_a_worker_killed_under_the_second_node_is_restarted_and_the_run_ends(
    tmp_path: Path,
) -> None:
    c = cluster(tmp_path, 12)
    first = node(c, "a", FIRST, work="train=0.2")
    second = node(c, "b", SECOND, work="generate=0.05")
    wait_for(lambda: c.steps_done() >= 3, 120, "three train steps")
    os.kill(pid_of(c, "b", "generate-b-0"), signal.SIGKILL)
    finish(c, first, second)
    assert "restarting generate-b-0" in c.log_text("node-b")


def test_a_scheduler_killed_under_the_first_node_resumes_and_the_run_ends(tmp_path: Path) -> None:
    c = cluster(tmp_path, 12)
    first = node(c, "a", FIRST, work="train=0.2")
    second = node(c, "b", SECOND, work="generate=0.05")
    wait_for(lambda: c.steps_done() >= 3, 120, "three train steps")
    found = c.endpoints()
    assert found is not None
    os.kill(found["pid"], signal.SIGKILL)
    finish(c, first, second)
    a, b = c.log_text("node-a"), c.log_text("node-b")
    assert "restarting scheduler" in a
    # The other machine's workers went on with the resumed scheduler: none restarted.
    assert "restarting generate-b-0" not in b and "restarting logp-0" not in b, b


@pytest.mark.heavy  # one of the slowest default runs (15-30 s): with the heavy tests
def test_a_worker_failing_on_every_start_stops_its_node_with_the_reason(tmp_path: Path) -> None:
    tcp = {"host": "127.0.0.1", "local_ipc": False}
    failing = {"actors": "tests.support.failing_roles"}  # its reward worker cannot start
    c = Cluster(tmp_path, run={"total_steps": 4}, scheduler=tcp, pipeline=failing)
    first = node(c, "a", "scheduler")
    try:
        second = node(c, "b", "reward")
        assert second.wait(120) == 1, c.log_text("node-b")[-3000:]
        text = c.log_text("node-b")
        assert text.count("started reward-b-0") == 3  # never a fourth time
        reason = [line for line in text.splitlines() if "starts in a row" in line]
        assert len(reason) == 1 and "reward-b-0 failed the same way on 3 starts" in reason[0]
        assert "the reward model's server at 127.0.0.1:9 refused" in reason[0]
    finally:
        first.send_signal(signal.SIGINT)  # Ctrl-C: the scheduler's node stops its child
        assert first.wait(60) == 130
    assert wait_for(lambda: not processes_mentioning(str(c.config_path)), 10, "no process left")


def asyncrl_node(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "node", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=cwd, check=False)


def test_a_node_without_the_run_secret_fails_with_one_line(tmp_path: Path) -> None:
    c = cluster(tmp_path, 4)
    result = asyncrl_node("-c", str(c.config_path), "--roles", "generate", "--wait", "1",
                          cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("asyncrl: error: no run secret ")
    assert "--with-scheduler" in errors[0] and str(c.run_dir) in errors[0]
    assert not (c.run_dir / "run.secret").exists()  # made only by the scheduler's machine


@pytest.mark.parametrize(
    ("roles", "named"),
    [
        ("genrate=2", "'genrate' is no role"),
        ("generate=-1", "generate='-1'"),
        ("train=2", "train=2, but train is one worker"),
    ],
)
def test_bad_roles_fail_with_one_line_before_anything_starts(
    tmp_path: Path, roles: str, named: str
) -> None:
    c = cluster(tmp_path, 4)
    result = asyncrl_node("-c", str(c.config_path), "--roles", roles, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and named in result.stderr, result.stderr
    assert not c.run_dir.exists()
