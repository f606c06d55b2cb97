"""LoRA on the embedded model, in one process: the trainer trains the adapters alone on
a frozen base and publishes them alone; a generator merges a version onto the base it
keeps and then computes the trainer's logits; the staged state and checkpoints hold the
adapters; ``final/`` loads with peft onto the base and as a merged model in transformers,
with the trainer's logits."""

from __future__ import annotations

import pytest
import torch

from asyncrl.actors.policy.adapters import MergedAdapters, adapted_modules
from asyncrl.actors.policy.checkpoint import load_model, load_state, model_dir
from asyncrl.actors.policy.lora import (
    FINAL_ADAPTER,
    add_adapters,
    read_adapters,
    save_adapter_checkpoint,
    save_final,
)
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.runtime.contract.config import config_from_dict
from tests.integration.test_train_group import _lease

pytest.importorskip("peft")

_LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _config(**lora):
    return config_from_dict(
        {"algorithm": {"micro_batch_groups": 2, "lr": 1e-2}, "model": {"lora": _LORA | lora}}
    )


def _trained_learner(steps: int = 1, seed: int = 0) -> Learner:
    torch.manual_seed(0)
    cfg = _config()
    model, codec = load_model("embedded")
    add_adapters(model, cfg.model.lora)
    learner = Learner(model, cfg, codec.pad_id)
    for step in range(steps):
        learner.step([Group.of(item) for item in _lease(seed + step).items])
    return learner


def _generator(cfg) -> torch.nn.Module:
    model, _ = load_model("embedded")
    spec = cfg.model.lora
    model.adapters = MergedAdapters(model, spec.target_modules, spec.scale)
    return model


_TOKENS = torch.tensor([[3, 7, 11, 4, 9, 2, 5], [6, 6, 3, 12, 8, 1, 0]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(_TOKENS)


def test_the_trainer_trains_and_publishes_the_adapters_alone():
    base = {n: t.clone() for n, t in load_model("embedded")[0].state_dict().items()}
    learner = _trained_learner()
    version = learner.full_weights()
    # The version: each adapted layer's A and B, nothing of the base.
    modules = adapted_modules(load_model("embedded")[0], _LORA["target_modules"])
    assert len(modules) == 3 * 4  # three kinds of layer in each of the 4 decoder layers
    assert sorted(version) == sorted(f"{m}.lora_{x}.weight" for m in modules for x in "AB")
    assert any(t.abs().sum() > 0 for n, t in version.items() if "lora_B" in n)  # it learned
    full = sum(t.numel() for t in base.values())
    assert sum(t.numel() for t in version.values()) < full / 10
    # The base did not move: every frozen parameter is still the base model's.
    for name, param in learner.model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, base[name.replace(".base_layer.", ".")]), name
    # The optimizer and the staged state hold the adapters alone.
    assert set(learner.full_optimizer_state()["state"]) == {
        n for n, p in learner.model.named_parameters() if p.requires_grad
    }
    assert all(".lora_" in key for key in learner.local_state())


def test_a_generator_merges_a_version_into_the_trainers_logits():
    learner = _trained_learner()
    generator = _generator(learner.cfg)
    base_logits = _logits(generator)
    assert load_state(generator, learner.full_weights(), copy=False) == []
    merged = _logits(generator)
    assert not torch.allclose(merged, base_logits)  # the version changed the outputs
    torch.testing.assert_close(merged, _logits(learner.model), rtol=0, atol=2e-5)


def test_versions_merge_onto_the_base_never_onto_each_other():
    first, second = _trained_learner(1, seed=0), _trained_learner(2, seed=5)
    skipping, following = _generator(first.cfg), _generator(first.cfg)
    load_state(following, first.full_weights())
    load_state(following, second.full_weights())
    load_state(skipping, second.full_weights())  # version 1 missed: nothing is lost
    pairs = zip(following.parameters(), skipping.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_a_version_that_is_not_the_adapters_is_refused_not_run_as_the_base():
    learner = _trained_learner()
    generator = _generator(learner.cfg)
    before = _logits(generator)
    version = learner.full_weights()
    partial = dict(list(version.items())[:-1])
    with pytest.raises(ValueError, match=r"missing .*lora_"):
        load_state(generator, partial)
    whole = load_model("embedded")[0].state_dict()
    with pytest.raises(ValueError, match="unexpected"):
        load_state(generator, whole)
    last = sorted(version)[-1]  # the last layer's B of another rank, found after the rest
    wrong = version | {last: torch.zeros(version[last].shape[0], 3)}
    with pytest.raises(ValueError, match=r"expected A \[rank, \d+\], B \[\d+, rank\]"):
        load_state(generator, wrong)
    assert torch.equal(_logits(generator), before)


def test_a_target_that_matches_nothing_is_named():
    model, _ = load_model("embedded")
    with pytest.raises(ValueError, match=r"\['qproj'\] match no linear layer; allowed: .*q_proj"):
        add_adapters(model, _config(target_modules=["q_proj", "qproj"]).model.lora)


def test_lm_head_is_refused_in_the_config():
    with pytest.raises(Exception, match="lm_head"):
        _config(target_modules=["lm_head"])


def test_a_checkpoint_holds_the_adapters_and_puts_them_back(tmp_path):
    learner = _trained_learner()
    version = learner.full_weights()
    save_adapter_checkpoint(
        learner.cfg.model.lora, version, model_dir("embedded"), tmp_path / "ckpt", {"x": b"1"}
    )
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors", "x"]
    fresh = Learner(_with_adapters(learner.cfg), learner.cfg, 0)
    fresh.load_full_weights(read_adapters(tmp_path / "ckpt"))
    assert all(torch.equal(version[n], t) for n, t in fresh.full_weights().items())


def _with_adapters(cfg):
    model, _ = load_model("embedded")
    add_adapters(model, cfg.model.lora)
    return model


def test_final_loads_with_peft_and_as_a_merged_model_with_the_trainers_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    from peft import PeftModel

    learner = _trained_learner()
    base = model_dir("embedded")
    final = tmp_path / "final"
    cfg = learner.cfg
    save_final(
        learner.model.config, cfg.model.lora, learner.full_weights(), base, final, torch.float32
    )
    expected = _logits(learner.model)
    auto = transformers.AutoModelForCausalLM
    merged = auto.from_pretrained(final).eval()
    adapted = PeftModel.from_pretrained(auto.from_pretrained(base), final / FINAL_ADAPTER).eval()
    with torch.no_grad():
        for model in (merged, adapted):
            logits = model(_TOKENS).logits
            # Padding aside (each row's real tokens are causal prefixes), the same logits.
            torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)


def test_without_peft_the_trainer_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    model, _ = load_model("embedded")
    with pytest.raises(RuntimeError, match=r"pip install 'asyncrl\[lora\]'"):
        add_adapters(model, _config().model.lora)


def test_the_trainers_preflight_names_a_target_that_matches_nothing():
    from asyncrl.actors.startup.role_checks import check_lora

    assert check_lora(_config()) == []
    assert check_lora(_config(target_modules=["q_proj", "qproj"])) == [
        "model.lora.target_modules: ['qproj'] match no linear layer; allowed: ['down_proj', "
        "'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj']"
    ]
