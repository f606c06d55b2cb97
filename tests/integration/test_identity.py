"""A worker is its connection: forged messages from a second client, and real restarts.

A real scheduler and real workers (the demo pipeline) run while a second client, which
does not hold the run's secret, speaks for live workers over its own connection, some of
it under routing ids that carry the victims' names. Each forged message is refused and
changes nothing: the run ends with every result exactly once. A worker killed with -9 and
started again under its name is known at once by its worker key; a process under that
name without the key is refused and exits with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.transport import protocol as p
from asyncrl.transport.security import keygen, load_client_keys
from asyncrl.transport.zmq_link import ZmqLink
from tests.support.cluster import ROLES, Cluster, wait_for

pytestmark = pytest.mark.timeout(120)

_REFUSED = {"wrong_sender", "wrong_key", "stale_fence", "unknown_lease"}


def link_as(c: Cluster, identity: str, keys_dir: Path | None = None) -> ZmqLink:
    where = c.endpoints()
    assert where is not None
    keys = None if keys_dir is None else load_client_keys(keys_dir)
    return ZmqLink(where["control"], where["events"], identity=identity, client_keys=keys)


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_forged_messages_from_a_second_client_are_refused_and_the_run_ends(
    cluster, tmp_path: Path, curve: bool
) -> None:
    """With CURVE the forger holds the run's key pair, as every worker does: the keys
    let it onto the bus, not speak for another worker."""
    keys = None
    scheduler = {"curve": "off"}  # loopback TCP with no keys at all: its owner chose so
    if curve:
        keys = tmp_path / "keys"
        keygen(keys)
        scheduler = {"curve": "on", "keys_dir": str(keys)}
    c: Cluster = cluster(run={"total_steps": 6}, scheduler=scheduler)
    c.scheduler()
    assert c.endpoints()["curve"] is curve
    c.all_workers(env={"ASYNCRL_DEMO_WORK_S": "generate=0.2"})
    wait_for(lambda: c.steps_done() >= 1, 60, "a train step")
    report = p.Report("generate-0", "validation", 1, {"val_reward": 0.0, "forged": 1})
    forged: list[tuple[str, p.Message]] = [
        # A validation report under another worker's name, from connections named alike.
        ("generate-0", report),
        ("generate-0/0123", report),
        ("logp-0", p.Bye("logp-0", "forged")),
        # A second Hello for a live name with another role, without the worker key.
        ("ref_logp-0", p.Hello("ref_logp-0", "reward", p.PROTOCOL_VERSION, 1)),
        ("ref_logp-0/00ff", p.Hello("ref_logp-0", "reward", p.PROTOCOL_VERSION, 1)),
        # A Fail naming an unregistered worker, for every lease so far, fences guessed.
        *(("ghost", p.Fail("ghost", n, n, None, "forged")) for n in range(1, 30)),
        *(("generate-0", p.Fail("generate-0", n, n, None, "forged")) for n in range(1, 30)),
    ]
    codes = []
    for identity, message in forged:
        with link_as(c, identity, keys) as link:
            reply = link.request(message, 5)
        assert isinstance(reply, p.Error) and reply.code in _REFUSED, (identity, message, reply)
        codes.append(reply.code)
    assert codes[3] == codes[4] == "wrong_key"
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
    for role in ROLES:
        assert c.wait(f"{role}-0", 30) == 0  # none was dropped or taken over
    log = c.log_text("scheduler")
    assert '"reason": "forged"' not in log and '"reason": "left: forged"' not in log
    assert log.count('"event": "worker registered"') == len(ROLES)  # none replaced
    validation = c.run_dir / "validation.jsonl"
    assert not validation.exists() or '"forged"' not in validation.read_text()


def test_a_worker_killed_and_started_again_under_its_name_registers_at_once(cluster) -> None:
    # Registrations outlive a dead worker by a minute here: a restart that had to wait for
    # the old one to time out could not finish in this test's time.
    c: Cluster = cluster(run={"total_steps": 6}, scheduler={"worker_timeout_s": 60})
    c.scheduler()
    c.all_workers(env={"ASYNCRL_DEMO_WORK_S": "generate=0.2"})
    wait_for(lambda: c.steps_done() >= 1, 60, "a train step")
    c.kill9("logp-0")
    c.worker("logp", 0)
    registered = '"worker registered"'

    def logp_registered_twice() -> bool:
        lines = [ln for ln in c.log_text("scheduler").splitlines() if registered in ln]
        return sum('"logp-0"' in ln for ln in lines) >= 2

    wait_for(logp_registered_twice, 20, "logp-0 registered again")
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
    assert "wrong_key" not in c.log_text("scheduler")


def test_a_process_under_a_live_name_without_its_key_exits_with_the_reason(cluster) -> None:
    c: Cluster = cluster(run={"total_steps": 4})
    c.scheduler()
    c.all_workers(env={"ASYNCRL_DEMO_WORK_S": "generate=0.2"})
    wait_for(lambda: c.steps_done() >= 1, 60, "a train step")
    argv = ["asyncrl.actors.cli", "--role", "reward", "--index", "0", "-c", str(c.config_path)]
    c.spawn("impostor", argv, env={"ASYNCRL_WORKER_KEY": "00" * 32})
    assert c.wait("impostor", 60) == 1
    said = c.log_text("impostor")
    assert "wrong_key" in said and "does not carry the worker key of 'reward-0'" in said
    assert "00" * 16 not in said  # the key it was given is nowhere in its words
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
