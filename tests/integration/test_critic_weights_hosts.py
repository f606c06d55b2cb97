"""PPO (``deploy/configs/ppo.yaml``) over two hosts (tests/support/hosts.py): the values
worker on a host of its own, the critic and every other role on the scheduler's. The
values host shares only the network and the run directory, so the critic's staged state
(in the critic host's /dev/shm) is out of its reach: each critic version it scores with
came over the weight plane, from the critic, as the policy's versions reach generators.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.runtime.contract.rundir import RunDir
from tests.support.host_run import HostRun, lines
from tests.support.hosts import Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    pytest.mark.timeout(300),
]

STEPS = 4
PLACEMENT = {"h1": "dataloader,generate,reward,critic,train", "h2": "values"}


def test_a_values_worker_on_another_host_scores_with_critic_versions_it_fetched(
    tmp_path: Path,
) -> None:
    overrides = [f"run.total_steps={STEPS}", "critic.warmup_steps=1", "critic.values=stage"]
    with Hosts(2, shared=[tmp_path]) as hosts:
        run = HostRun(hosts, tmp_path, overrides=overrides, config="deploy/configs/ppo.yaml")
        run.start(PLACEMENT)
        run.finish()
        received = hosts.counters("h2").received
    run.check_exactly_once(STEPS)
    # Not on the shared run directory: in the critic host's own RAM, which h2 cannot see.
    staged = RunDir(run.run_dir).critic_staged_state
    assert staged.parts[:3] == ("/", "dev", "shm"), staged
    loads = [m for m in lines(run.run_dir / "weights.jsonl") if m["worker"].startswith("values")]
    assert loads, f"the values worker loaded no critic version\n{run.tails()}"
    assert all(m["source"].startswith("critic") and m["bytes"] > 0 for m in loads), loads
    versions = [m["version"] for m in loads]
    assert versions == sorted(set(versions)) and versions[0] >= 1, versions
    assert received > sum(m["bytes"] for m in loads)  # the bytes came over h2's link
    # The critic's steps took values the values worker made with those versions: within
    # the staleness bound, which values of version 0 alone could not keep after a few.
    steps = run.steps()
    assert steps[-1]["critic_step"] >= 3 and steps[-1]["critic_version"] >= 2, steps[-1]
    assert all(0 <= s["critic_staleness_max"] <= 2 for s in steps), steps
