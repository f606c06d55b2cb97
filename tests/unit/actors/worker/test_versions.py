"""What a worker does with the versions it hears of when training rolls back."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from asyncrl.actors.actor import Actor
from asyncrl.actors.worker.version_tracking import PolicyRolledBack, Versions
from asyncrl.transport import protocol as p


class _Generator(Actor):
    role = "generate"

    def on_version(self, version: int) -> int | None:
        return version


def _versions(sent: list[Any]) -> Versions:
    def call(message: p.Message, **_: object) -> p.Message:
        sent.append(message)
        return p.Ack()

    log = structlog.get_logger("test")
    return Versions(_Generator(), "gen-0", call, lambda: None, lambda: 0.0, 1.0, log)


def _ready(policy_version: int) -> p.Ready:
    return p.Ready("gen-0", "run", p.PROTOCOL_VERSION, 1.0, 10.0, 1 << 20, policy_version)


def test_registering_again_reports_the_loaded_version() -> None:
    sent: list[Any] = []
    versions = _versions(sent)
    versions.registered(_ready(3), first=True)
    assert versions.load_newest() and versions.loaded == 3
    versions.registered(_ready(4), first=False)
    assert sent[-1] == p.LoadedVersion("gen-0", 3)


def test_a_published_version_behind_the_loaded_one_means_it_was_rolled_back() -> None:
    versions = _versions([])
    versions.registered(_ready(3), first=True)
    versions.load_newest()
    with pytest.raises(PolicyRolledBack, match=r"rolled back to version 1; .* version 3"):
        versions.registered(_ready(1), first=False)


class _Values(_Generator):
    role = "values"
    follows_critic = True


def test_a_critic_version_behind_the_loaded_one_means_the_critic_rolled_back() -> None:
    log = structlog.get_logger("test")
    versions = Versions(_Values(), "val-0", lambda *_, **__: p.Ack(), lambda: None,
                        lambda: 0.0, 1.0, log)  # fmt: skip
    versions.registered(_critic_ready(3), first=True)
    versions.load_newest()
    assert versions.loaded == 3
    versions.registered(_critic_ready(3), first=False)  # the same: nothing lost
    with pytest.raises(PolicyRolledBack, match=r"the critic rolled back to version 1; .* 3"):
        versions.registered(_critic_ready(1), first=False)


def _critic_ready(critic_version: int) -> p.Ready:
    """The policy far ahead: a values worker goes by the critic's version alone."""
    return p.Ready("val-0", "run", p.PROTOCOL_VERSION, 1.0, 10.0, 1 << 20, 7,
                   critic_version=critic_version)  # fmt: skip
