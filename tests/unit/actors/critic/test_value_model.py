"""The critic's value model: the policy's decoder under a value head."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from asyncrl.actors.critic import ValueModel, load_value_model, response_values
from asyncrl.actors.policy.checkpoint import load_model, model_dir, read_weights, save_state
from asyncrl.actors.policy.config import ModelConfig
from asyncrl.actors.policy.model import Decoder
from asyncrl.actors.policy.scoring import pack, response_positions
from asyncrl.actors.rl import value_loss

# Two rows: a single turn, and a multi-turn one whose tokens 2 and 3 are an observation.
PROMPTS = [[1, 5, 6], [1, 7]]
RESPONSES = [[8, 9, 10], [11, 12, 13, 14, 15]]
TRAINED = [[True, True, True], [True, True, False, False, True]]


def test_it_takes_the_policy_decoder_and_starts_at_zero() -> None:
    policy, _ = load_model("embedded")
    critic, _ = load_value_model("embedded")
    names = {n for n, _ in critic.named_parameters()}
    assert names == {n for n, _ in policy.named_parameters() if n != "lm_head.weight"} | {
        "score.weight",
        "score.bias",
    }
    packed = pack(PROMPTS, RESPONSES, pad_id=0, trained=TRAINED)
    inputs, columns, _ = response_positions(packed, torch.device("cpu"))
    with torch.no_grad():
        assert torch.equal(critic.hidden(inputs, columns), policy.hidden(inputs, columns))
        assert torch.equal(response_values(critic, packed), torch.zeros(2, 5))


def test_values_sit_on_the_model_tokens_and_learn_their_targets() -> None:
    torch.manual_seed(0)
    critic, _ = load_value_model("embedded")
    packed = pack(PROMPTS, RESPONSES, pad_id=0, trained=TRAINED)
    mask = packed.mask.bool()
    targets = torch.tensor([[1.0, 0.5, -1.0, 0.0, 0.0], [0.2, 0.3, 9.0, 9.0, -0.4]])
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        values = response_values(critic, packed)
        old = values.detach()
        loss, _ = value_loss(
            values, old, targets, mask, clip=float("inf"), total_tokens=float(mask.sum())
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
        assert torch.equal(values.detach()[~mask], torch.zeros(int((~mask).sum())))
    assert losses[-1] < 0.1 * losses[0], losses


def test_a_directory_without_a_decoder_weight_is_named(tmp_path) -> None:
    source = model_dir("embedded")
    shutil.copy(source / "config.json", tmp_path / "config.json")
    shutil.copy(source / "tokenizer.json", tmp_path / "tokenizer.json")
    weights = read_weights(source)
    del weights["model.norm.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"no weights for the critic's \['model.norm.weight'\]"):
        load_value_model(str(tmp_path))


def test_its_forward_gives_one_float32_value_per_position() -> None:
    critic, _ = load_value_model("embedded", torch.bfloat16)
    assert isinstance(critic, ValueModel)
    out = critic(torch.tensor([[1, 5, 6, 7]]))
    assert out.shape == (1, 4) and out.dtype == torch.float32


def test_critic_layers_keeps_the_lowest_layers_of_the_directory(tmp_path) -> None:
    # critic.layers=1: the embeddings, layer 0 and the final norm of the policy's weights
    # under the value head; the policy's decoder cut after layer 0 gives the same features.
    policy, _ = load_model("embedded")
    critic, _ = load_value_model("embedded", layers=1)
    assert len(critic.model.layers) == 1
    names = {n for n, _ in critic.named_parameters()} - {"score.weight", "score.bias"}
    kept = {n for n, _ in policy.named_parameters() if not n.startswith("model.layers.")}
    kept = kept | {n for n, _ in policy.model.layers[0].named_parameters(prefix="model.layers.0")}
    assert names == kept - {"lm_head.weight"}
    packed = pack(PROMPTS, RESPONSES, pad_id=0, trained=TRAINED)
    inputs, columns, _ = response_positions(packed, torch.device("cpu"))
    cut = Decoder(policy.config.lowest_layers(1))
    whole = policy.state_dict()
    cut.load_state_dict({name: whole[name] for name in cut.state_dict()})
    with torch.no_grad():
        assert torch.equal(critic.hidden(inputs, columns), cut.hidden(inputs, columns))
    # Saved, it is a model directory of one layer, which loads as it is.
    save_state(critic.config, dict(critic.state_dict()), model_dir("embedded"), tmp_path / "c")
    saved = json.loads((tmp_path / "c" / "config.json").read_text())
    assert saved["num_hidden_layers"] == 1
    again, _ = load_value_model(str(tmp_path / "c"))
    assert len(again.model.layers) == 1


def test_more_layers_than_the_directory_has_are_named() -> None:
    with pytest.raises(ValueError, match=r"critic\.layers=5: the critic's directory has 4 decoder"):
        load_value_model("embedded", layers=5)


def test_a_cut_config_keeps_each_kept_layers_attention_kind() -> None:
    config = ModelConfig.from_hf(
        {
            "architectures": ["Qwen2ForCausalLM"],
            "vocab_size": 32,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 2,
        }
    )
    cut = config.lowest_layers(3)
    assert cut.num_hidden_layers == 3 and cut.layer_types == config.layer_types[:3]
    assert cut.to_hf()["layer_types"] == list(config.layer_types[:3])
    with pytest.raises(ValueError, match="5 of 4 decoder layers"):
        config.lowest_layers(5)
