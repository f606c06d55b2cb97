"""UCX with ``weights.map_on_host``, with real processes: generators on the trainer's host
map the staged slot files, generators on other hosts fetch the same version over UCX, and
a generator that keeps an old version keeps its bytes while the trainer goes on.

"Another host" is the same machine here: such a receiver is started with another host
identity (a test hook in its own process), so it takes the UCX path. The test process
plays the scheduler (tests/support/weight_nodes.py); every version a generator gets is
compared byte for byte with the same state rebuilt in its own process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.transport.weights.base import NeedsPlan
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
)

pytestmark = pytest.mark.timeout(120)

ELSEWHERE = "another-host/boot"


def start(n: Nodes, shm_dir: Path, local: int, remote: int) -> tuple[Node, list[Node], list[Node]]:
    trainer = n.publisher(strategy="ucx-map", shm_dir=str(shm_dir))
    here = [n.receiver(f"here-{i}", strategy="ucx-map") for i in range(local)]
    away = [n.receiver(f"away-{i}", strategy="ucx-map", host=ELSEWHERE) for i in range(remote)]
    n.started(trainer, *here, *away)
    return trainer, here, away


def served(trainer: Node) -> int:
    return trainer.ask("served", "served")[0]


def test_generators_here_map_and_generators_elsewhere_fetch_the_same_bytes(shm_dir):
    with nodes() as n:
        trainer, here, away = start(n, shm_dir, local=2, remote=1)
        for version in (1, 2, 3):
            announcement = publish(trainer, version)
            manifest = announcement.manifest
            assert "file" in manifest and "shm" in manifest
            before = served(trainer)
            for node in here:
                assert take(node, announcement, trainer, version).source == "mapped"
            assert served(trainer) == before, "a generator on the host fetched over UCX"
            take(away[0], announcement, trainer, version)
            total = manifest["total"]
            assert served(trainer) == before + total  # the one elsewhere, once
        for node in (*here, *away):
            assert node.ask("loaded", "check_loaded") == (3, [])
        assert len(slot_files(shm_dir)) == 2  # the two staging buffers, nothing more
        assert here[0].ask("address", "address")[0] == b""  # maps: offers no relay
        assert away[0].ask("address", "address")[0] != b""


def test_a_generator_on_an_old_version_keeps_it_while_the_trainer_moves_on(shm_dir):
    with nodes() as n:
        trainer, (slow, fast), _ = start(n, shm_dir, local=2, remote=0)
        take(slow, publish(trainer, 1), trainer, 1)
        for version in range(2, 7):  # slot 0 comes round again while slow runs on it
            take(fast, publish(trainer, version), trainer, version)
        assert slow.ask("loaded", "check_loaded") == (1, [])
        assert fast.ask("loaded", "check_loaded") == (6, [])
        held = len(slot_files(shm_dir))
        assert held == 3, slot_files(shm_dir)  # two buffers, plus the one slow holds
        take(slow, publish(trainer, 7), trainer, 7)
        for version in range(8, 11):  # slow let go: its file is reused, none is added
            announcement = publish(trainer, version)
            for node in (slow, fast):
                take(node, announcement, trainer, version)
        assert len(slot_files(shm_dir)) == held
        assert slow.ask("loaded", "check_loaded") == (10, [])


def test_a_mapping_generator_planned_as_a_relay_sends_the_asker_elsewhere_quickly(shm_dir):
    with nodes() as n:
        trainer, (mapper,), (asker,) = start(n, shm_dir, local=1, remote=1)
        assert mapper.address != b""  # before its first map it offers its UCX address
        announcement = publish(trainer, 1)
        take(mapper, announcement, trainer, 1)
        asker.send("want", plan_from(announcement, mapper, 1), MIB_STATE)
        failed = asker.outcome(OUTCOME_S / 3)  # long before the 10 s stall timeout
        assert isinstance(failed, NeedsPlan) and failed.failed == mapper.name
        take(asker, announcement, trainer, 1)


def test_no_room_in_shared_memory_stages_privately_and_everyone_fetches(tmp_path):
    with nodes() as n:
        trainer = n.publisher(strategy="ucx-map", shm_dir=str(tmp_path / "s"), no_space=True)
        here = n.receiver("here-0", strategy="ucx-map")
        n.started(trainer, here)
        announcement = publish(trainer, 1)
        assert "file" not in announcement.manifest
        take(here, announcement, trainer, 1)
        assert served(trainer) == announcement.manifest["total"]
        assert here.ask("loaded", "check_loaded") == (1, [])
