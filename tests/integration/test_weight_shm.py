"""The shared-memory weight plane with real processes: one staged copy for every generator
on the host, pins that survive anything but the generator, kill -9 on either side, and
corrupt or rewritten files that are never handed over.

The test process plays the scheduler (tests/support/weight_nodes.py). Every version a
generator gets is compared, tensor by tensor and byte for byte, with the same state
rebuilt in its own process.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from asyncrl.transport.weights.base import NeedsPlan, Received
from asyncrl.transport.weights.shm.slot_file import _CHECKED, _CHECKED_AT, HEADER_BYTES
from tests.support.weight_nodes import (
    MIB_STATE,
    OUTCOME_S,
    Node,
    Nodes,
    nodes,
    plan_from,
    publish,
    slot_files,
    take,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)


def check_held(path: Path) -> bool:
    """Whether a generator holds the host's check of the version in ``path``."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _CHECKED.size, _CHECKED_AT)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, _CHECKED.size, _CHECKED_AT)
        return False
    finally:
        os.close(fd)


def start(n: Nodes, shm_dir: Path, *names: str, **options: object) -> tuple[Node, list[Node]]:
    trainer = n.publisher(strategy="shm", shm_dir=str(shm_dir))
    generators = [n.receiver(name, strategy="shm", **options) for name in names]
    n.started(trainer, *generators)
    return trainer, generators


def test_every_generator_runs_on_the_one_staged_copy_byte_exact(shm_dir: Path) -> None:
    with nodes() as n:
        trainer, generators = start(n, shm_dir, "gen-1", "gen-2", "gen-3")
        first = publish(trainer, 1)
        for node in generators:
            take(node, first, trainer, 1)
            assert node.ask("loaded", "check_loaded") == (1, [])
        assert len(slot_files(shm_dir)) == 2  # the trainer's two files, no copy per generator


def test_a_pinned_version_is_never_written_and_the_trainer_never_waits(shm_dir: Path) -> None:
    with nodes() as n:
        trainer, (stays, follows) = start(n, shm_dir, "gen-stays", "gen-follows")
        first = publish(trainer, 1)
        take(stays, first, trainer, 1)
        for version in range(1, 7):
            announcement = first if version == 1 else publish(trainer, version)
            if version > 1:
                take(follows, announcement, trainer, version)
            assert stays.ask("loaded", "check_loaded") == (1, [])
        # Pinned: version 1 (gen-stays) and the newest (gen-follows); one more to write in.
        assert len(slot_files(shm_dir)) == 3


def test_a_killed_generator_lets_go_of_its_version(shm_dir: Path) -> None:
    with nodes() as n:
        trainer, (victim, peer) = start(n, shm_dir, "gen-1", "gen-2")
        first = publish(trainer, 1)
        take(victim, first, trainer, 1)
        victim.kill9()  # its lock goes with it
        for version in (2, 3, 4):
            take(peer, publish(trainer, version), trainer, version)
        assert len(slot_files(shm_dir)) == 2


def test_a_generator_killed_while_checking_holds_up_neither_peer_nor_trainer(
    shm_dir: Path,
) -> None:
    with nodes() as n:
        trainer, (victim,) = start(n, shm_dir, "gen-slow", pace_s=60)
        (peer,) = [n.receiver("gen-2", strategy="shm")]
        n.started(peer)
        first = publish(trainer, 1)
        victim.send("want", plan_from(first, trainer, 1), MIB_STATE)
        # It holds the host's check of version 1 (sleeping inside it) until it is killed.
        path = shm_dir / first.manifest["file"]
        wait_until(lambda: check_held(path), 20, "gen-slow checking")
        peer.send("want", plan_from(first, trainer, 1), MIB_STATE)
        with pytest.raises(TimeoutError):
            peer.outcome(2.0)  # waiting for the first check, as it should
        victim.kill9()
        got = peer.outcome(OUTCOME_S)
        assert isinstance(got, Received) and got.version == 1
        take(peer, publish(trainer, 2), trainer, 2)


def test_a_killed_trainer_leaves_loaded_versions_intact_and_a_new_one_serves(
    shm_dir: Path,
) -> None:
    with nodes() as n:
        trainer, generators = start(n, shm_dir, "gen-1", "gen-2")
        first = publish(trainer, 1)
        for node in generators:
            take(node, first, trainer, 1)
        publish(trainer, 2)  # not taken: nobody holds it
        trainer.kill9()
        for node in generators:
            assert node.ask("loaded", "check_loaded") == (1, [])
        successor = n.publisher("trainer-2", strategy="shm", shm_dir=str(shm_dir))
        n.started(successor)
        # The successor removed the dead trainer's unheld file, not the pinned one.
        assert len(slot_files(shm_dir)) == 1
        third = publish(successor, 3)
        for node in generators:
            take(node, third, successor, 3)
            assert node.ask("loaded", "check_loaded") == (3, [])


def test_a_corrupt_bucket_is_never_handed_over(shm_dir: Path) -> None:
    with nodes() as n:
        trainer, generators = start(n, shm_dir, "gen-1", "gen-2")
        first = publish(trainer, 1)
        for node in generators:
            take(node, first, trainer, 1)
        second = publish(trainer, 2)
        name = second.manifest["file"]
        offset = 2 * second.manifest["bucket_bytes"] + 12345
        with open(shm_dir / name, "r+b") as f:  # a stray write after staging
            f.seek(HEADER_BYTES + offset)
            byte = f.read(1)[0]
            f.seek(HEADER_BYTES + offset)
            f.write(bytes([byte ^ 0xFF]))
        for node in generators:  # each checks it: a failed check is never recorded as done
            node.send("want", plan_from(second, trainer, 2), MIB_STATE)
            got = node.outcome(OUTCOME_S)
            assert isinstance(got, NeedsPlan), f"{node.name}: {got}"
            assert got.failed == "trainer" and "buckets [2]" in got.reason
            assert node.ask("loaded", "check_loaded") == (1, [])
        for node in generators:
            take(node, publish(trainer, 3), trainer, 3)


def test_a_plan_for_a_version_since_rewritten_is_refused(shm_dir: Path) -> None:
    with nodes() as n:
        trainer, (late,) = start(n, shm_dir, "gen-late")
        first = publish(trainer, 1)
        publish(trainer, 2)
        publish(trainer, 3)  # into version 1's file: nobody held it
        late.send("want", plan_from(first, trainer, 1), MIB_STATE)
        got = late.outcome(OUTCOME_S)
        assert isinstance(got, NeedsPlan), got
        assert "holds version 3" in got.reason
