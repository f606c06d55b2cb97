"""A trainer of two ranks whose ranks are on two hosts (tests/support/hosts.py), each
started by that host's ``asyncrl node`` (``--roles ...,train@0`` and ``train@1``): the
ranks meet where rank 0 announces in the shared run directory, without a person typing an
address; the run learns and ends exactly once. Then rank 1's host loses power mid-run and boots
again: the group starts again together and the run still ends exactly once. And a scoring
group (logp) split the same way."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asyncrl.runtime.contract.gangs import announced_leader
from asyncrl.runtime.contract.rundir import RunDir
from tests.support.host_run import HostRun, lines
from tests.support.hosts import Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    pytest.mark.heavy,  # two hosts, a trainer of two ranks on 2 cores
    pytest.mark.timeout(360),
]

# Rank 0 beside the scheduler; rank 1 beside the generator: the group's collectives, and
# its store, cross the hosts' link.
PLACEMENT = {"h1": "dataloader,reward,logp,train@0", "h2": "generate,train@1"}
# A lost rank is noticed by its collectives within this (a host that lost power answers
# nothing: its connections end only by timeout).
SPLIT = ["pipeline.workers.train=2", "backends.collective_timeout_s=30"]
CHECKPOINT_EVERY = 2
QUIET = ["data.val_every_versions=0"]


def _started(run: HostRun, host: str, child: str) -> int:
    return run.node_log(host).read_text().count(f"started {child} (pid")


# Published from rank 0 (gathered whole), or from every rank, each its own rows: then the
# generator on h2 maps rank 1's part there and fetches rank 0's from h1.
@pytest.mark.parametrize("from_every_rank", [False, True], ids=["from-rank-0", "from-every-rank"])
def test_a_trainer_split_over_two_hosts_meets_by_itself_and_ends_exactly_once(
    tmp_path: Path, from_every_rank: bool
) -> None:
    steps = 20
    parts = [f"weights.from_every_rank={str(from_every_rank).lower()}"]
    with Hosts(2, shared=[tmp_path]) as hosts:
        overrides = [f"run.total_steps={steps}", *SPLIT, "data.val_every_versions=10", *parts]
        run = HostRun(hosts, tmp_path, overrides=overrides)
        run.start(PLACEMENT)
        run.finish(timeout_s=240)
        leader = announced_leader(RunDir(run.run_dir).group_leader("train"))
        h1 = hosts.address("h1")
    run.check_exactly_once(steps)
    assert leader is not None and leader[0] == h1, leader  # where h2's rank found it
    assert all(m.get("train_ranks") == 2 for m in run.steps()), run.steps()
    assert _started(run, "h2", "train-1") == 1 and _started(run, "h1", "train-0") == 1
    # The generator on h2 ran the group's versions: they came from rank 0 on h1.
    loads = [m for m in lines(run.run_dir / "weights.jsonl") if m["worker"] == "generate-h2-0"]
    assert loads and all(m["source"] == "train-0" for m in loads), loads
    announced = [
        r["manifest_keys"] for r in lines(run.run_dir / "logs" / "scheduler.log")
        if r.get("event") == "weights announced"
    ]  # fmt: skip
    assert announced and all(("parts" in keys) == from_every_rank for keys in announced)
    # It learns: the model of step 10 scores well above the untrained one (as under Slurm,
    # 0.44 -> 0.71). The last version is validated only if a generator loads it in time.
    validation = lines(run.run_dir / "validation.jsonl")
    assert [v["version"] for v in validation] in ([0, 10], [0, 10, 20]), validation
    assert validation[1]["val_reward"] >= validation[0]["val_reward"] + 0.15, validation


def test_rank_1s_host_loses_power_and_boots_again_the_run_ends_exactly_once(
    tmp_path: Path,
) -> None:
    steps = 10
    every = f"pipeline.checkpoint_every={CHECKPOINT_EVERY}"
    with Hosts(2, shared=[tmp_path]) as hosts:
        overrides = [f"run.total_steps={steps}", every, *SPLIT, *QUIET]
        run = HostRun(hosts, tmp_path, overrides=overrides)
        run.start(PLACEMENT)
        run.wait_for_steps(3, 180)
        hosts.kill_host("h2")
        time.sleep(2.0)
        hosts.start_host("h2")
        run.start_node("h2", PLACEMENT["h2"])
        run.finish(timeout_s=300)
    run.check_exactly_once(steps)
    # Rank 0 lost its group and started again to meet rank 1's new start.
    assert _started(run, "h1", "train-0") >= 2, run.tails()
    # Rank 1's staged state was in h2's memory (/dev/shm), gone with it: the group rolled
    # the run back exactly to its newest checkpoint, in the shared run directory.
    (rolled,) = [
        r for r in lines(run.run_dir / "logs" / "train-0.log")
        if r.get("event", "").startswith("the trainer's state is older")
    ]  # fmt: skip
    counted = rolled["scheduler_steps"]
    assert rolled["trainer_step"] == counted - counted % CHECKPOINT_EVERY > 0, rolled


def test_a_scoring_group_split_over_two_hosts_takes_each_version(tmp_path: Path) -> None:
    """logp's two ranks on two hosts: its leader fetches each version and hands each rank
    its shard within the group, across the hosts' link."""
    steps = 6
    placement = {"h1": "dataloader,reward,train,logp@0", "h2": "generate,logp@1"}
    overrides = [f"run.total_steps={steps}", "pipeline.workers.logp=2", *SPLIT[1:], *QUIET]
    with Hosts(2, shared=[tmp_path]) as hosts:
        run = HostRun(hosts, tmp_path, overrides=overrides)
        run.start(placement)
        run.finish(timeout_s=240)
    run.check_exactly_once(steps)
    assert _started(run, "h2", "logp-1") == 1 and _started(run, "h1", "logp-0") == 1
    loads = [m for m in lines(run.run_dir / "weights.jsonl") if m["worker"] == "logp-0"]
    # The last step's groups came from version steps - 1 - max_staleness (2) or newer,
    # and logp scored them under the newest it held, no older: a fast run may have made
    # and scored them all before a later version came out, so no newer is owed.
    assert loads and max(m["version"] for m in loads) >= steps - 1 - 2, loads
