"""The live status shows the newest step's reward, token entropy and learning rate, and
forgets them with the steps a rollback loses."""

from __future__ import annotations

from pathlib import Path

from asyncrl.runtime.scheduler.status_text import render_status
from asyncrl.transport import protocol as p
from tests.unit.runtime.scheduler.test_service import make, one_step


def test_the_status_shows_the_newest_steps_reward_and_entropy(tmp_path: Path) -> None:
    service = make(tmp_path, total_steps=3)
    assert "learning" not in service.status(0.0)  # no step yet
    one_step(service, "a", {"reward_mean": 0.25, "entropy": 1.5})
    one_step(service, "b", {"reward_mean": 0.5, "entropy": 1.234567, "lr": 2.5e-4})
    summary = service.status(0.0)
    expected = {"step": 2, "reward_mean": 0.5, "entropy": 1.234567, "lr": 2.5e-4}
    assert summary["learning"] == expected
    lines = render_status(summary).splitlines()
    assert "learning  step 2: reward 0.500, entropy 1.235 nats/token, lr 0.00025" in lines
    # A rollback past it takes its line away.
    ready = service.handle(p.Hello("train", "train", p.PROTOCOL_VERSION, 2), 0.0)
    assert isinstance(ready, p.Ready)
    assert service.handle(p.Rewind("train", 1), 0.0) == p.Ack()
    assert "learning" not in service.status(0.0)


def test_a_trainer_that_measures_no_entropy_shows_its_reward_alone(tmp_path: Path) -> None:
    service = make(tmp_path)
    one_step(service, "a", {"reward_mean": 0.75})
    assert "learning  step 1: reward 0.750" in render_status(service.status(0.0)).splitlines()
