"""The default run across three hosts (tests/support/hosts.py), as on a cluster: one
``asyncrl node`` per host, the bus over TCP with CURVE, payloads fetched between hosts,
weights over UCX from the trainer's host to the generator's, only the run directory
shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.host_run import HostRun, lines
from tests.support.hosts import HOST_KINDS, HostKind, Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    pytest.mark.timeout(240),
]

STEPS = 10
# The scheduler's host runs the dataloader; the generator's, the reward; the trainer's,
# logp: so payloads and weights cross hosts, and also stay on one where they can.
PLACEMENT = {"h1": "dataloader", "h2": "generate,reward", "h3": "train,logp"}


# Machines, and containers: hosts that share the machine's boot id and IPC namespace, as
# containers on one kernel often do, and UCX alone would take them for one machine. Both
# runs are heavy (26-33 s each in CI); the default suite keeps the transfers between
# hosts of each kind (test_container_hosts.py, test_weight_map_on_host.py).
@pytest.mark.heavy
@pytest.mark.parametrize("kind", HOST_KINDS)
def test_the_default_run_across_three_hosts_with_curve(tmp_path: Path, kind: HostKind) -> None:
    with Hosts(3, shared=[tmp_path], kind=kind) as hosts:
        run = HostRun(hosts, tmp_path, overrides=[f"run.total_steps={STEPS}"])
        run.start(PLACEMENT)
        run.finish()
        traffic = {name: hosts.counters(name) for name in hosts.names()}
    run.check_exactly_once(STEPS)
    # Weights went over UCX from the trainer's host to the generator's, and were mapped
    # from shared memory by logp beside the trainer; the bytes crossed h3's link.
    loads = lines(run.run_dir / "weights.jsonl")
    across = [m for m in loads if m["worker"].startswith("generate-h2")]
    assert across and all(m["source"] == "train-0" for m in across), loads
    beside = [m for m in loads if m["worker"].startswith("logp")]
    assert beside and all(m["source"] == "mapped" for m in beside), loads
    sent = sum(m["bytes"] for m in across)
    assert traffic["h3"].sent > sent and traffic["h2"].received > sent
    # The keys the scheduler's node made reached every host through the shared directory.
    assert (run.run_dir / "keys").is_dir()


# Two generator hosts, each with its own number (and seed); the relay tree's fan-out 1, so
# the trainer sends a version to one receiver and the first generator relays it on. logp,
# beside the trainer, maps its files, yet asks for the first version before it knows it
# will and so may be planned as a relay: a generator hung under it is told at once that
# it holds nothing, and fetches elsewhere (it waited 5 s for that answer over TCP, and a
# generator hung under that one as long).
FOUR = {**PLACEMENT, "h4": "generate=1"}
FIRST_VERSION_S = 2.0  # from the first version's publication to both generators running it


@pytest.mark.heavy  # four hosts: 17 s in CI on 2 idle cores, about a minute on busy ones
def test_two_generator_hosts_one_relaying_to_the_other(tmp_path: Path) -> None:
    with Hosts(4, shared=[tmp_path]) as hosts:
        overrides = [f"run.total_steps={STEPS}", "weights.relay_fanout=1"]
        run = HostRun(hosts, tmp_path, overrides=overrides)
        run.start(FOUR, first_index={"h4": 1})
        run.finish()
    run.check_exactly_once(STEPS)
    loads = lines(run.run_dir / "weights.jsonl")
    generators = {"generate-h2-0", "generate-h4-1"}
    by = {g: [m for m in loads if m["worker"] == g] for g in generators}
    assert all(by.values()), f"a generator loaded no version: {loads}\n{run.tails()}"
    relayed = [m for g in generators for m in by[g] if m["source"] in generators - {g}]
    assert relayed, f"no version went from one generator to the other: {loads}"
    # Step 1's version (or a newer one, as versions may be skipped) ran on both soon.
    reached = {v["step"]: v for m in run.steps() for v in m.get("versions_loaded") or []}
    first = reached.get(1, {}).get("published_to_loaded_s")
    assert first is not None and first < FIRST_VERSION_S, (reached.get(1), loads)
