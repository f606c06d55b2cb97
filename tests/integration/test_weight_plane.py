"""The UCX weight plane with real processes: relay chains, kill -9, corrupt buckets and
dual-buffer reuse.

The test process plays the scheduler (tests/support/weight_nodes.py): it starts a
publisher and receivers, hands out Plans, and kills nodes with SIGKILL. Every version a
receiver gets is compared, tensor by tensor and byte for byte, with the same state
rebuilt in the receiver's process; a Received with a single wrong byte fails the test.
A fetch is "mid-transfer" when the receiver's checked bytes are above 0 and below the
total; receivers are paced (a sleep before each range, in their own process) so that a
fetch lasts long enough to be caught there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from asyncrl.transport.weights.base import NeedsPlan, Received
from tests.support.weight_nodes import MiB, Node, nodes, plan_from, wait_until

pytestmark = pytest.mark.timeout(90)

STALL_S = 1.5  # the receivers' stall timeout: how long a silent source is waited for
OUTCOME_S = 30.0


def mid_transfer(*receivers: Node, total: int) -> Callable[[], bool]:
    """True once each receiver has checked some, but not all, of its ``total`` bytes."""

    def check() -> bool:
        return all(0 < r.checked() < total for r in receivers)

    return check


def received(node: Node, version: int, source: Node, timeout: float = OUTCOME_S) -> Received:
    got = node.outcome(timeout)
    assert isinstance(got, Received), f"{node.name}: {got}"
    assert (got.version, got.source) == (version, source.name)
    return got


def served(publisher: Node) -> int:
    return publisher.ask("served", "served")[0]


def test_a_version_reaches_a_chain_of_relays_byte_exact() -> None:
    with nodes() as n:
        trainer = n.publisher(bucket_mb=4)
        chain = [n.receiver(f"gen-{i}", bucket_mb=3) for i in (1, 2, 3)]
        n.started(trainer, *chain)
        (announcement,) = trainer.ask("announced", "publish", 1, 96, timeout=OUTCOME_S)
        total = announcement.manifest["total"]
        sources = [trainer, *chain[:-1]]  # gen-1 from the trainer, gen-2 from gen-1, ...
        for node, source in zip(chain, sources, strict=True):
            node.send("want", plan_from(announcement, source, 1), 96)
        for node, source in zip(chain, sources, strict=True):
            got = received(node, 1, source)
            assert (got.nbytes, got.attempts, got.retried_buckets) == (total, 1, 0)
        # The relays carried it on: the trainer sent each byte once.
        wait_until(lambda: served(trainer) == total, 5, f"{total} bytes served")


def test_a_receiver_killed_mid_transfer_harms_neither_the_publisher_nor_its_peers() -> None:
    with nodes() as n:
        trainer = n.publisher(send_timeout_s=STALL_S)
        victim, peer = (
            n.receiver(name, bucket_mb=1, pace_s=0.02, stall_timeout_s=STALL_S)
            for name in ("gen-1", "gen-2")
        )
        n.started(trainer, victim, peer)
        (announcement,) = trainer.ask("announced", "publish", 1, 48, timeout=OUTCOME_S)
        total = announcement.manifest["total"]
        for node in (victim, peer):
            node.send("want", plan_from(announcement, trainer, 1), 48)
        wait_until(mid_transfer(victim, peer, total=total), 20, "both fetches mid-way")
        assert 0 < served(trainer) < 2 * total
        victim.kill9()
        got = received(peer, 1, trainer)
        assert got.attempts == 1
        # The trainer goes on: the next versions are staged (the second one over the
        # slot the dead receiver was reading) and served whole.
        for version in (2, 3):
            (announcement,) = trainer.ask("announced", "publish", version, 16, timeout=20)
            peer.send("want", plan_from(announcement, trainer, version), 16)
            received(peer, version, trainer)


def test_a_killed_relays_downstream_is_told_and_resumes_from_the_publisher() -> None:
    with nodes() as n:
        trainer = n.publisher(send_timeout_s=STALL_S)
        relay = n.receiver("gen-1", bucket_mb=1, pace_s=0.02, stall_timeout_s=STALL_S)
        downstream = n.receiver("gen-2", bucket_mb=1, stall_timeout_s=STALL_S)
        n.started(trainer, relay, downstream)
        (announcement,) = trainer.ask("announced", "publish", 1, 48, timeout=OUTCOME_S)
        total = announcement.manifest["total"]
        relay.send("want", plan_from(announcement, trainer, 1), 48)
        wait_until(lambda: relay.checked() > 0, 20, "the relay's first bucket")
        downstream.send("want", plan_from(announcement, relay, 1), 48)
        wait_until(mid_transfer(downstream, relay, total=total), 20, "the chain mid-way")
        relay.kill9()
        killed_at = time.monotonic()
        lost = downstream.outcome(OUTCOME_S)
        assert isinstance(lost, NeedsPlan), lost
        assert (lost.version, lost.failed) == (1, "gen-1")
        assert time.monotonic() - killed_at < STALL_S + 2.0
        kept = downstream.kept
        assert 0 < kept < total
        before = served(trainer)
        downstream.send("want", plan_from(announcement, trainer, 1), 48)
        got = received(downstream, 1, trainer)
        assert got.attempts == 2
        # It resumed: the trainer sent exactly the bytes it had not checked.
        wait_until(lambda: served(trainer) - before == total - kept, 5, "the rest served")


def test_a_killed_publisher_leaves_loaded_versions_intact_and_a_new_one_serves() -> None:
    with nodes() as n:
        trainer = n.publisher(send_timeout_s=STALL_S)
        generators = [
            n.receiver(f"gen-{i}", bucket_mb=1, pace_s=0.02, stall_timeout_s=STALL_S)
            for i in (1, 2)
        ]
        n.started(trainer, *generators)
        (first,) = trainer.ask("announced", "publish", 1, 16, timeout=OUTCOME_S)
        for node in generators:
            node.send("want", plan_from(first, trainer, 1), 16)
        for node in generators:
            received(node, 1, trainer)  # and loaded: the model runs on its buffer
        (second,) = trainer.ask("announced", "publish", 2, 48, timeout=OUTCOME_S)
        for node in generators:
            node.send("want", plan_from(second, trainer, 2), 48)
        wait_until(mid_transfer(*generators, total=second.manifest["total"]), 20, "fetches mid-way")
        trainer.kill9()
        for node in generators:
            lost = node.outcome(OUTCOME_S)
            assert isinstance(lost, NeedsPlan), f"{node.name}: {lost}"
            assert (lost.version, lost.failed) == (2, "trainer")
            assert node.ask("loaded", "check_loaded") == (1, [])
        successor = n.publisher("trainer-2", send_timeout_s=STALL_S)
        n.started(successor)
        (third,) = successor.ask("announced", "publish", 3, 16, timeout=OUTCOME_S)
        for node in generators:
            node.send("want", plan_from(third, successor, 3), 16)
        for node in generators:
            got = received(node, 3, successor)
            assert got.attempts == 1
            assert node.ask("loaded", "check_loaded") == (3, [])


@pytest.mark.parametrize("mode", ["once", "always"])
def test_a_corrupt_bucket_is_fetched_again_and_never_handed_over(mode: str) -> None:
    bucket = 4 * MiB
    corrupt_at = 2 * bucket + 12345  # in bucket 2, inside the range [6, 9) MiB
    with nodes() as n:
        trainer = n.publisher(bucket_mb=4, corrupt=(corrupt_at, mode))
        generator = n.receiver("gen-1", bucket_mb=3, stall_timeout_s=STALL_S)
        n.started(trainer, generator)
        (announcement,) = trainer.ask("announced", "publish", 1, 32, timeout=OUTCOME_S)
        generator.send("want", plan_from(announcement, trainer, 1), 32)
        got = generator.outcome(OUTCOME_S)
        if mode == "once":  # fixed before it was asked for again
            assert isinstance(got, Received), got
            assert (got.retried_buckets, got.attempts) == (1, 1)
            return
        assert isinstance(got, NeedsPlan), got
        assert got.failed == "trainer" and "bucket 2 of version 1 corrupt twice" in got.reason
        assert generator.kept == 2 * bucket  # nothing from the corrupt bucket on counts
        # A sound source finishes the fetch from the last checked byte.
        sound = n.publisher("trainer-2", bucket_mb=4)
        n.started(sound)
        (again,) = sound.ask("announced", "publish", 1, 32, timeout=OUTCOME_S)
        assert again.manifest == announcement.manifest
        generator.send("want", plan_from(again, sound, 1), 32)
        got = received(generator, 1, sound)
        assert got.attempts == 2


def test_a_slot_reused_under_a_slow_receiver_never_hands_over_mixed_versions() -> None:
    with nodes() as n:
        trainer = n.publisher(send_timeout_s=STALL_S)
        slow = [
            n.receiver(f"gen-{i}", bucket_mb=1, pace_s=0.03, stall_timeout_s=STALL_S)
            for i in (1, 2)
        ]
        n.started(trainer, *slow)
        lost = 0
        for version in (1, 4):
            (fetched,) = trainer.ask("announced", "publish", version, 32, timeout=OUTCOME_S)
            total = fetched.manifest["total"]
            for node in slow:
                node.send("want", plan_from(fetched, trainer, version), 32)
            wait_until(mid_transfer(*slow, total=total), 20, "the slow fetches mid-way")
            # Version+1 goes to the other slot; version+2 must take the slot being read.
            for newer in (version + 1, version + 2):
                (newest,) = trainer.ask("announced", "publish", newer, 32, timeout=OUTCOME_S)
            for node in slow:
                got = node.outcome(OUTCOME_S)  # a Received is checked byte for byte
                assert got.version == version, f"{node.name}: {got}"
                lost += isinstance(got, NeedsPlan)
            for node in slow:
                node.send("want", plan_from(newest, trainer, version + 2), 32)
            for node in slow:
                received(node, version + 2, trainer)
        assert lost > 0  # the slot was taken from under a reader at least once
