"""Faults only a network of machines has, each on the default run across three hosts
(tests/support/hosts.py) with one ``asyncrl node`` per host: a whole host dying (every
process on it at once, its /dev/shm with them) and coming back as a machine reboots, its
init starting the node again; a slow link under the generator's host; the scheduler's
host dying and coming back to resume from the journal on the shared run directory.

Each run must end by itself (every node exits 0), every step once in metrics.jsonl,
every group trained exactly once, none dead, nothing left running.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.scheduler.replay import replay_journal
from tests.support.host_run import GROUPS_PER_STEP, HostRun, lines
from tests.support.hosts import HOST_KINDS, HostKind, Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    # As machines, and as containers on one kernel (its boot id and IPC namespace shared).
    pytest.mark.parametrize("kind", HOST_KINDS),
    pytest.mark.timeout(300),
]

# As test_hosts_run.py: payloads and weights cross hosts, and also stay on one.
PLACEMENT = {"h1": "dataloader", "h2": "generate,reward", "h3": "train,logp"}
DOWN_S = 2.0  # how long a killed host stays off before it boots again
# Longer than the journal takes to write what the scheduler did (records reach the OS at
# once, fsync every 50 ms); far shorter than a silent worker's timeout (15 s).
JOURNAL_SETTLES_S = 0.5
QUIET = ["data.val_every_versions=0"]  # no validation passes: shorter runs, same faults


def reboot(hosts: Hosts, run: HostRun, host: str) -> None:
    """``host`` loses power, stays off ``DOWN_S``, boots, and its init starts its node."""
    hosts.kill_host(host)
    time.sleep(DOWN_S)
    boot(hosts, run, host)


def boot(hosts: Hosts, run: HostRun, host: str) -> None:
    hosts.start_host(host)
    run.start_node(host, PLACEMENT[host], resume=host == run.scheduler_host)


def finish(hosts: Hosts, run: HostRun) -> None:
    """Every node ends by itself with 0, and nothing of the run is left on any host."""
    run.finish()
    for host in hosts.names():
        listed = hosts.run(host, ["ps", "-e", "-o", "pid=,args="]).stdout.splitlines()
        left = [line for line in listed if line.split()[0] != "1" and " ps -e " not in f"{line} "]
        assert not left, f"left running on {host}: {left}"


def waiting_for_training(run: HostRun) -> int:
    """Groups generated and not yet taken by the trainer, as the journal has it now."""
    groups = replay_journal(RunDir(run.run_dir))["groups"]
    return groups.get("generated", 0) + groups.get("ready", 0)


def cut_off_while_training_waits_on(hosts: Hosts, run: HostRun, host: str) -> None:
    """Cut ``host``'s link at a moment when, past the third step, groups wait for training
    whose rollouts only ``host`` keeps: they must be made again.

    Seen before the cut, such groups may still be taken by the trainer before it (the
    scheduler journals a lease after sending it), and then nothing of ``host``'s is
    lost. So the journal is read once the cut has settled in it; where the trainer took
    every waiting group before the cut, the link comes back (a cut far shorter than a
    worker's timeout) and the test waits for the next such moment.
    """
    for _ in range(20):
        run.wait_for(lambda: len(run.steps()) >= 3 and waiting_for_training(run), 120,
                     "three steps and rollouts waiting for training")  # fmt: skip
        hosts.cut_link(host)
        time.sleep(JOURNAL_SETTLES_S)
        if waiting_for_training(run):
            return
        hosts.restore_link(host)
    raise AssertionError(f"the trainer took every waiting group before each cut\n{run.tails()}")


def records(run: HostRun, name: str, event: str) -> list[dict]:
    return [r for r in lines(run.run_dir / "logs" / f"{name}.log") if r.get("event") == event]


@pytest.mark.heavy  # 30-95 s on 2 busy cores: a reboot, readers waiting out a silent holder
def test_the_generators_host_dies_and_boots_again(tmp_path: Path, kind: HostKind) -> None:
    steps = 12
    with Hosts(3, shared=[tmp_path], kind=kind) as hosts:
        run = HostRun(hosts, tmp_path, overrides=[f"run.total_steps={steps}", *QUIET])
        run.start(PLACEMENT)
        # Once groups wait for training whose rollouts are kept only on h2.
        cut_off_while_training_waits_on(hosts, run, "h2")
        at_reboot, rebooted = len(run.steps()), datetime.now(UTC)
        reboot(hosts, run, "h2")
        finish(hosts, run)
    run.check_exactly_once(steps)
    # Its workers came back with the host, under a new node; nothing elsewhere restarted
    # (a reader whose holder vanished reports the payloads, it does not crash).
    h2 = run.node_log("h2").read_text()
    assert h2.count("started generate-h2-0 ") == h2.count("started reward-h2-0 ") == 2, h2
    for host in ("h1", "h3"):
        assert "restarting" not in run.node_log(host).read_text(), run.tails()
    # What the generator held in its /dev/shm was made again; the new one got weights.
    regenerated = replay_journal(RunDir(run.run_dir))["regenerated"]
    assert regenerated.get("generate", 0) >= 1, regenerated
    # Found lost by a reader, or, where the scheduler already knew h2's workers were gone,
    # made again before any lease named them.
    assert records(run, "scheduler", "payload lost") or records(
        run, "scheduler", "payloads of gone holders made again before leasing"
    ), run.tails()
    # Within the staleness bound (2) of the step count it found: the current weights, or
    # newer. Not the last version: the last steps' groups may be generated before it.
    loaded = [
        r["version"]
        for r in records(run, "generate-h2-0", "loaded a policy version")
        if datetime.fromisoformat(r["timestamp"]) > rebooted
    ]
    assert loaded and max(loaded) >= max(1, at_reboot - 2), (at_reboot, loaded)


@pytest.mark.heavy  # 55-80 s: a reboot and a rollback
def test_the_trainers_host_dies_and_training_rolls_back_to_its_checkpoint(
    tmp_path: Path, kind: HostKind
) -> None:
    steps, every = 12, 4
    overrides = [f"run.total_steps={steps}", f"pipeline.checkpoint_every={every}", *QUIET]
    with Hosts(3, shared=[tmp_path], kind=kind) as hosts:
        run = HostRun(hosts, tmp_path, overrides=overrides)
        run.start(PLACEMENT)
        # Past a checkpoint, not at one: steps are lost.
        run.wait_for(lambda: len(run.steps()) % every and len(run.steps()) > every, 120,
                     "a step past the first checkpoint")  # fmt: skip
        hosts.kill_host("h3")  # its staged state goes with its /dev/shm
        time.sleep(DOWN_S)
        done = len(run.steps())  # every step the trainer completed is counted by now
        boot(hosts, run, "h3")
        finish(hosts, run)
    newest = done // every * every  # the newest checkpoint on the shared directory
    assert done > newest, f"the host died at a checkpoint ({done}): nothing to roll back"
    restored = records(run, "train-0", "trainer state restored")
    assert [(r["step"], r["source"]) for r in restored] == [
        (0, "base model"), (newest, "checkpoint")
    ], restored  # fmt: skip
    rolled = records(run, "scheduler", "training rolled back")
    lost = done - newest
    assert [(r["step"], r["trained_again"], r["metrics_lines_cut"]) for r in rolled] == [
        (newest, lost * GROUPS_PER_STEP, lost)
    ], rolled  # fmt: skip
    # Every step once in the end; the lost steps' groups trained again from their
    # prompts, under new keys, and never also kept their first training.
    run.check_exactly_once(steps)
    keys = [key for m in run.steps() for key in m["keys"]]
    redone = [key for key in keys if key.endswith("#rollback1")]
    assert len(redone) == lost * GROUPS_PER_STEP, redone
    assert not {key.removesuffix("#rollback1") for key in redone} & set(keys)
    # A generator on a lost version started afresh (its node restarted it), saying why.
    afresh = [r for r in records(run, "generate-h2-0", "worker failed")
              if "rolled back" in r.get("error", "")]  # fmt: skip
    for record in afresh:
        assert f"rolled back to version {newest}" in record["error"], record


# With the heavy tests (~30 s alone): no reboot, only a slower run.
@pytest.mark.heavy
def test_a_slow_link_under_the_generators_host_for_the_whole_run(
    tmp_path: Path, kind: HostKind
) -> None:
    steps, rate_bits = 6, 16_000_000  # a version of ~3.2 MB takes ~1.6 s to cross it
    with Hosts(3, shared=[tmp_path], kind=kind) as hosts:
        hosts.limit_rate("h2", f"{rate_bits // 1_000_000}mbit")
        run = HostRun(hosts, tmp_path, overrides=[f"run.total_steps={steps}", *QUIET])
        run.start(PLACEMENT)
        finish(hosts, run)
        received = hosts.counters("h2").received
    run.check_exactly_once(steps)
    # The limit bit: every version the generator loaded crossed the link at its rate.
    loads = [m for m in lines(run.run_dir / "weights.jsonl") if m["worker"] == "generate-h2-0"]
    assert loads, run.tails()
    for load in loads:
        assert load["transfer_s"] >= 0.8 * load["bytes"] * 8 / rate_bits, load
    assert received > sum(m["bytes"] for m in loads)


@pytest.mark.heavy  # 40-55 s: a reboot and a resume
def test_the_schedulers_host_dies_and_the_run_resumes_from_its_journal(
    tmp_path: Path, kind: HostKind
) -> None:
    steps = 12
    with Hosts(3, shared=[tmp_path], kind=kind) as hosts:
        run = HostRun(hosts, tmp_path, overrides=[f"run.total_steps={steps}", *QUIET])
        run.start(PLACEMENT)
        run.wait_for_steps(3, 120)
        reboot(hosts, run, "h1")  # its node started with --resume
        finish(hosts, run)
    run.check_exactly_once(steps)
    # The other hosts' workers went on and registered again by themselves: none restarted.
    for host in ("h2", "h3"):
        assert "restarting" not in run.node_log(host).read_text(), run.tails()
    h1 = run.node_log("h1").read_text()
    assert h1.count("started scheduler ") == 2, h1
