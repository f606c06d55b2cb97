"""``asyncrl launch --on slurm`` on a real Slurm (tests/support/slurm.py): slurmctld and
three slurmd, each on a host of its own (tests/support/hosts.py), two fake GPUs per node
as gres; the default run submitted with sbatch over two of the nodes, the scheduler on
the batch host, the generator on the other with its GPUs from --gres."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.host_run import CONTROL_PORT, check_exactly_once, lines
from tests.support.hosts import Hosts
from tests.support.slurm import Slurm, why_no_slurm

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(why_no_slurm() is not None, reason=str(why_no_slurm())),
    pytest.mark.timeout(420),
]

NODES = ["h2", "h3", "h4"]  # h1 is the controller's, and the login node's
PLACEMENT = (
    "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 1, logp: 1}}, "
    "{roles: {generate: 1}, gpus: 2}]"
)
# A trainer of two ranks, one on each node (train@0 beside the scheduler, train@1 beside
# the generator): its ranks meet where rank 0 announces in the shared run directory.
SPLIT_TRAINER = [
    "pipeline.workers.train=2",
    "placement.nodes=[{roles: {scheduler: 1, dataloader: 1, reward: 1, train: 1, logp: 1}}, "
    "{roles: {generate: 1, train: 1}, gpus: 2}]",
]


def _launch(slurm: Slurm, root: Path, steps: int, *more: str) -> tuple[str, Path]:
    """Submit the default run with ``asyncrl launch --on slurm``; its job id and run dir.
    ``more`` after the run's own settings (a placement there replaces PLACEMENT)."""
    run_dir = root / "run"
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "launch", "--on", "slurm",
        "-c", str(Path("deploy/configs/default.yaml").resolve()),
        f"run.dir={run_dir}", f"run.total_steps={steps}", "scheduler.host=0.0.0.0",
        "scheduler.curve='on'", f"scheduler.control_port={CONTROL_PORT}",
        f"scheduler.events_port={CONTROL_PORT + 1}", PLACEMENT, *more,
    ]  # fmt: skip
    out = slurm.run(argv, cwd=Path.cwd()).stdout
    assert out.startswith("submitted job "), out
    return out.split()[2], run_dir


def _wait_for_job(slurm: Slurm, job: str, run_dir: Path, timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        fields = slurm.job(job)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return fields
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} not over after {timeout_s:g} s: {fields}\n"
                                 f"{_tails(slurm, run_dir)}")  # fmt: skip
        time.sleep(1)


def _tails(slurm: Slurm, run_dir: Path, chars: int = 2500) -> str:
    paths = sorted((run_dir / "logs").glob("*"))
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in paths)
    return f"{logs}\n{slurm.tails()}"


@pytest.mark.parametrize("trainer", [[], SPLIT_TRAINER], ids=["one-rank", "split-over-nodes"])
def test_a_run_submitted_to_slurm_learns_and_finishes(tmp_path: Path, trainer: list[str]) -> None:
    steps = 20
    with (
        Hosts(4, shared=[tmp_path]) as hosts,
        Slurm(hosts, tmp_path, controller="h1", nodes=NODES) as slurm,
    ):
        job, run_dir = _launch(slurm, tmp_path, steps, "data.val_every_versions=10", *trainer)
        fields = _wait_for_job(slurm, job, run_dir, 300)
        assert fields["JobState"] == "COMPLETED", f"{fields}\n{_tails(slurm, run_dir)}"
        # Two GPUs per node from --gres, as the placement says of the generator's node.
        assert fields["TresPerNode"] == "gres:gpu:2", fields
    check_exactly_once(run_dir, steps)
    output = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    # The scheduler ran on the batch host, the generator on the job's other node.
    batch_host = fields["BatchHost"]
    assert f"asyncrl node {batch_host}: " in output, output
    loads = {m["worker"] for m in lines(run_dir / "weights.jsonl")}
    generators = {w for w in loads if w.startswith("generate-")}
    assert generators and all(batch_host not in w for w in generators), (loads, batch_host)
    # It learns: the model of step 10 scores well above the untrained one (0.44 -> 0.77
    # when tried). The last version is validated only when a generator loads it before the
    # run stops (timing decides).
    validation = lines(run_dir / "validation.jsonl")
    assert [v["version"] for v in validation] in ([0, 10], [0, 10, 20]), validation
    assert validation[1]["val_reward"] >= validation[0]["val_reward"] + 0.15, validation
    if trainer:  # every step by both ranks, rank 1 on the generator's node
        assert all(m.get("train_ranks") == 2 for m in lines(run_dir / "metrics.jsonl"))
        assert f"asyncrl node {batch_host}: started train-0 " in output, output
        assert re.search(rf"asyncrl node (?!{batch_host}:)\S+: started train-1 ", output), output


def test_the_dry_run_prints_the_script_and_submits_nothing(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "launch", "--on", "slurm",
        "--dry-run", f"run.dir={tmp_path / 'run'}", "scheduler.host=0.0.0.0", PLACEMENT,
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert "#SBATCH --nodes=2" in out and "#SBATCH --requeue" in out
    assert not (tmp_path / "run").exists()


# Split: the node killed holds the trainer's rank 1 too, and its staged state in memory.
@pytest.mark.parametrize("trainer", [[], SPLIT_TRAINER], ids=["one-rank", "split-over-nodes"])
def test_a_node_killed_mid_run_the_job_is_requeued_and_the_run_ends_exactly_once(
    tmp_path: Path, trainer: list[str]
) -> None:
    steps = 30
    with (
        Hosts(4, shared=[tmp_path]) as hosts,
        Slurm(hosts, tmp_path, controller="h1", nodes=NODES) as slurm,
    ):
        job, run_dir = _launch(slurm, tmp_path, steps, *trainer)
        deadline = time.monotonic() + 180
        while len(lines(run_dir / "metrics.jsonl")) < 5:
            assert time.monotonic() < deadline, _tails(slurm, run_dir)
            time.sleep(0.5)
        fields = slurm.job(job)
        (generators_node,) = set(slurm.hostnames(fields["NodeList"])) - {fields["BatchHost"]}
        # The generator's machine dies: its slurmd and every process on it, off the network.
        hosts.kill_host(generators_node)
        fields = _wait_for_job(slurm, job, run_dir, 300)
        assert fields["JobState"] == "COMPLETED", f"{fields}\n{_tails(slurm, run_dir)}"
        assert slurm.node_states()[generators_node].startswith("down"), slurm.node_states()
        last_nodes = slurm.hostnames(fields["NodeList"])
    # Slurm started the job again on the nodes left, and it resumed from the journal.
    assert int(fields["Restarts"]) >= 1 and generators_node not in last_nodes, fields
    output = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert "(resumed)" in output, output
    # Started with --resume at once: no scheduler refused the journal there (exit 2).
    assert not re.search(r"scheduler \(pid \d+[^)]*\) exited with code [1-9]", output), output
    check_exactly_once(run_dir, steps)
