"""``asyncrl run`` of the code config, real processes: the reward role runs every response
as a program in the sandbox. Hostile programs each score 0 with their reason in the
reward worker's log, and the run ends exactly as an undisturbed one does."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.actors.sandbox import sandbox_problem
from tests.support import default_run
from tests.support.cluster import processes_mentioning
from tests.support.default_run import REPO, records, run_config
from tests.support.host_run import check_exactly_once
from tests.support.hostile_code import ESCAPED, HOSTILE

WHY_NO_SANDBOX = sandbox_problem()
needs_a_sandbox = pytest.mark.skipif(
    WHY_NO_SANDBOX is not None, reason=f"no sandbox here: {WHY_NO_SANDBOX}"
)
pytestmark = pytest.mark.timeout(300)

STEPS = 4


def run_code(run_dir: Path, *overrides: str) -> None:
    run_config("code.yaml", run_dir, STEPS, *overrides, timeout_s=250)


@pytest.mark.heavy  # about a minute: with the heavy tests, which CI runs
@needs_a_sandbox
def test_the_code_config_trains_on_programs_run_in_the_sandbox(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_code(run_dir)
    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # The base model writes the right function now and then: rewards in between.
    assert 0 < sum(s["reward_mean"] for s in steps) / STEPS < 1
    assert processes_mentioning(str(run_dir)) == []


@pytest.mark.heavy
@needs_a_sandbox
def test_hostile_programs_score_0_with_their_reasons_and_the_run_ends_exactly(
    tmp_path: Path,
) -> None:
    """A reward plug-in scores, in place of the model's, an infinite loop, a fork bomb, a
    memory hog, a network connection, a write outside the program's directory, endless
    output and a kill of its parent, each once: each scores 0 with its reason logged, no
    group fails, every step and every group is trained once."""
    run_dir = tmp_path / "run"
    run_code(run_dir, "data.reward=tests.support.hostile_code:reward")
    check_exactly_once(run_dir, STEPS)
    scored = {r["response"]: r["reason"] for r in records(run_dir, "reward-0", "program scored 0")}
    for kind, program in HOSTILE.items():
        assert scored.get(program), f"{kind}: no record of it scoring 0"
    assert "ran past 1 s" in scored[HOSTILE["infinite loop"]]
    assert "Network is unreachable" in scored[HOSTILE["network"]]
    # On a loaded machine, the time limit may come before the other one.
    assert re.search("memory|ran past", scored[HOSTILE["memory hog"]])
    assert re.search("printed over|ran past", scored[HOSTILE["huge output"]])
    assert records(run_dir, "reward-0", "group failed") == []
    assert not Path(ESCAPED).exists()
    assert processes_mentioning(str(run_dir)) == []


# A user namespace of its own where no further one may be made: root there cannot give a
# program a uid of its own (none is mapped), nor a user namespace.
NO_SANDBOX = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1) here")
def test_a_machine_that_cannot_give_a_sandbox_refuses_the_run_before_it_starts(
    tmp_path: Path,
) -> None:
    asyncrl = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main"]
    probe = ["unshare", "--user", "--map-root-user", "sh", "-c", NO_SANDBOX, "sh", "true"]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot make a user namespace here")
    run_dir = tmp_path / "run"
    argv = [
        *probe[:-1], *asyncrl, "run", "-c", str(REPO / "deploy" / "configs" / "code.yaml"),
        f"run.dir={run_dir}", "scheduler.control_port=0", "scheduler.events_port=0",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "asyncrl: data.task='asyncrl.actors.tasks.code:task': its reward runs model-written "
        "code, and this machine cannot give it a sandbox: "
    )
    assert not run_dir.exists()  # nothing started
