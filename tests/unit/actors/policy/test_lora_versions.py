"""A LoRA run's generator that misses an adapter version is detected, never run on the
base (or on the version before) under the new version's number.

The generator is a real decoder over a model whose versions are adapters
(:class:`MergedAdapters`), following versions through the worker's :class:`Versions`,
which reports what it loaded to a real scheduler core (synchronous: max_staleness 0).
Version 2 reaches it torn (an adapter tensor missing, as when a bucket never arrives):
it is not applied, the decoder keeps version 1's weights and number, the scheduler keeps
the generator at version 1 and gives it no group to generate for step 3; when version 2
arrives whole the generator loads it and gets work again, and the scheduler refuses
tokens that claim any version but those between the one it reported and the newest.
"""

from __future__ import annotations

import structlog
import torch

from asyncrl.actors.actor import Actor
from asyncrl.actors.policy.adapters import MergedAdapters
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder
from asyncrl.actors.worker.version_tracking import Versions
from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core.effects import Accepted, Rejected
from asyncrl.transport import protocol as p
from tests.unit.runtime.scheduler.test_core import generate, grant, make_core, score


class _AdapterGenerator(Actor):
    """Loads the version the test hands it (``arriving``) into its decoder."""

    role = "generate"

    def __init__(self) -> None:
        model, _ = load_model("embedded")
        model.adapters = MergedAdapters(model, ["q_proj", "v_proj"], scale=2.0)
        self.model = model
        self.decoder = Decoder(
            model, slots=2, max_new_tokens=4, max_prompt_tokens=8, eos_id=1, pad_id=0
        )
        self.arriving: dict[str, torch.Tensor] = {}

    def on_version(self, version: int) -> int | None:
        self.decoder.load(self.arriving, version)
        return version

    def version_of(self, seed: int) -> dict[str, torch.Tensor]:
        """An adapter version: each adapted layer's A [4, in] and B [out, 4]."""
        generator = torch.Generator().manual_seed(seed)
        state = {}
        for module in self.model.adapters.modules:
            out, inner = self.model.get_submodule(module).weight.shape
            state[f"{module}.lora_A.weight"] = torch.randn(4, inner, generator=generator) * 0.1
            state[f"{module}.lora_B.weight"] = torch.randn(out, 4, generator=generator) * 0.1
        return state

    def logits(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model(torch.tensor([[3, 7, 11, 4, 9]]))


def _train_a_step(core) -> None:
    """One group generated, scored and trained; the trainer publishes the new version."""
    generate(core, 1)
    score(core)
    step = grant(core.claim("train", "tr", 1, 0.0))
    assert core.complete(step.lease_id, step.fence, list(step.groups))
    assert isinstance(core.publish_version("tr", core.state.steps_done), Accepted)


def test_a_generator_that_misses_an_adapter_version_is_detected_not_run_on_the_base() -> None:
    core = make_core(max_staleness=0, train_batch_groups=1)
    core.add_groups([f"g{i}" for i in range(4)])
    sent: list[p.Message] = []

    def call(message: p.Message, **_: object) -> p.Message:
        sent.append(message)
        assert isinstance(message, p.LoadedVersion)
        accepted = core.loaded_version(message.worker, message.version)
        return p.Ack() if isinstance(accepted, Accepted) else p.Error("bad_version", "")

    actor = _AdapterGenerator()
    log = structlog.get_logger("test")
    versions = Versions(actor, "gen", call, lambda: None, lambda: 0.0, 1.0, log)
    base_logits = actor.logits()

    _train_a_step(core)  # version 1 arrives whole
    actor.arriving = actor.version_of(1)
    versions.heard_of(1)
    assert versions.load_newest() and versions.loaded == 1 == actor.decoder.version
    first_logits = actor.logits()
    assert not torch.allclose(first_logits, base_logits)

    _train_a_step(core)  # version 2 arrives without one of its tensors
    torn = actor.version_of(2)
    torn.pop(next(iter(torn)))
    actor.arriving = torn
    versions.heard_of(2)
    assert not versions.load_newest()
    # Not applied, and not claimed: the decoder runs version 1 as version 1 ...
    assert versions.loaded == 1 == actor.decoder.version
    assert torch.equal(actor.logits(), first_logits)
    assert [m.version for m in sent] == [1]
    # ... and the scheduler, holding the generator at 1, gives it nothing for step 3.
    assert core.state.workers["gen"].loaded == 1
    assert core.claim("generate", "gen", 1, 0.0) is None

    actor.arriving = actor.version_of(2)  # version 2 whole: loaded, reported, work again
    assert versions.load_newest() and versions.loaded == 2 == actor.decoder.version
    assert [m.version for m in sent] == [1, 2]
    assert not torch.allclose(actor.logits(), first_logits)
    lease = grant(core.claim("generate", "gen", 1, 0.0))
    assert lease.version == 2
    # Tokens that said they came from an older version than the one reported loaded (a
    # generator that fell back) are refused, and so are ones of a version not published.
    for versions in ([(1, 1)], [(2, 3)]):
        refused = core.complete(lease.lease_id, lease.fence, list(lease.groups), versions)
        assert isinstance(refused, Rejected) and refused.reason == Reason.BAD_VERSION
    assert core.complete(lease.lease_id, lease.fence, list(lease.groups), [(2, 2)])
