"""megatron-core's GPTModel, built on CPU from a model directory by the megatron engine,
computes what transformers computes on the same weights, for every supported family.

This is the strongest check of the weight mapping: a q/k/v row in the wrong query group,
gate and up swapped, or a missing norm would not agree to 1e-4. The model is built in a
one-rank gloo group (megatron's process groups over it), torn down after the module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.actors.engines import device_of, load_weights, weights_of
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.runtime.config import MegatronSection
from tests.support.hf_families import SMALL, VARIANTS, hf_model_dir

pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
CPU = torch.device("cpu")
# megatron biases every linear layer or none: an attention bias without an MLP one is
# refused (real Qwen3 checkpoints have neither).
REFUSED = {"qwen3-untied-bias"}


@pytest.fixture(scope="module", autouse=True)
def _megatron_groups():
    torch.set_num_threads(1)
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def load(path: str):
    from asyncrl.actors.engines.megatron.model import load_megatron

    return load_megatron(path, torch.float32, CPU, MegatronSection())


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - REFUSED))
def test_logits_match_transformers_on_the_same_weights(variant: str, tmp_path: Path) -> None:
    directory = hf_model_dir(tmp_path, variant)
    expected_model = transformers.AutoModelForCausalLM.from_pretrained(directory).float().eval()
    model, _ = load(str(directory))
    ids = torch.randint(0, SMALL["vocab_size"], (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model.eval()(ids)
        expected = expected_model(ids).logits
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= TOLERANCE
    # Only some columns of each row, as scoring asks for them.
    columns = torch.tensor([[2, 5], [0, 11], [7, 7]])
    with torch.no_grad():
        picked = model(ids, columns)
    assert torch.equal(picked, got[torch.arange(3)[:, None], columns])


def test_weights_come_back_out_by_hugging_face_name_unchanged(tmp_path: Path) -> None:
    directory = hf_model_dir(tmp_path, "llama3-rope-untied-biases")
    ours, _ = load_model(str(directory))
    model, _ = load(str(directory))
    assert device_of(model) == CPU
    got, expected = weights_of(model), weights_of(ours)
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    changed = {name: t + 1 for name, t in expected.items()}
    load_weights(model, changed)
    assert all(torch.equal(weights_of(model)[n], changed[n]) for n in changed)


def test_a_training_step_gives_the_torch_engines_gradients() -> None:
    ours, _ = load_model("embedded")
    model, _ = load("embedded")
    ids = torch.randint(
        3, ours.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2)
    )
    columns = torch.arange(4, 12).expand(2, 8)
    for m in (ours, model):
        torch.log_softmax(m(ids, columns), dim=-1)[..., 5].mean().backward()
    expected = ours.model.embed_tokens.weight.grad
    got = model.gpt.embedding.word_embeddings.weight.grad
    assert (got - expected).abs().max() <= 1e-5 * max(1.0, float(expected.abs().max()))


def test_an_attention_bias_without_an_mlp_bias_is_refused_by_name(tmp_path: Path) -> None:
    directory = hf_model_dir(tmp_path, "qwen3-untied-bias")
    with pytest.raises(ValueError, match="biases every linear layer or none"):
        load(str(directory))


def test_a_mapped_qwen3_moe_checkpoint_fits_megatrons_moe_model(tmp_path: Path) -> None:
    """Names and shapes only: megatron's router moves its weight to the current CUDA
    device in forward, so an MoE model computes only on a GPU."""
    import dataclasses
    import json

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from safetensors.torch import load_file

    from asyncrl.actors.engines.megatron import model as engine
    from asyncrl.actors.engines.megatron.mapping import Layout, hf_to_megatron
    from asyncrl.actors.policy.model import ModelConfig
    from tests.support.hf_families import hf_model

    fields = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    hf_model("qwen3_moe", head_dim=12, tie_word_embeddings=False, **fields).save_pretrained(
        tmp_path
    )
    config = json.loads((tmp_path / "config.json").read_text())
    layout = Layout.from_hf(config)
    # The attention and norms are Qwen3's: built from its dense twin, experts added.
    dense = ModelConfig.from_hf(
        {**config, "architectures": ["Qwen3ForCausalLM"]} | {"model_type": "qwen3"}
    )
    sizes = engine.ParallelSizes()
    engine.ensure_parallel_state(sizes, CPU)
    moe = dataclasses.replace(
        engine.transformer_config(dense, torch.float32, CPU, sizes),
        num_moe_experts=4,
        moe_router_topk=2,
        moe_ffn_hidden_size=16,
        moe_aux_loss_coeff=0.0,
    )
    spec = get_gpt_layer_local_spec(num_experts=4, qk_layernorm=True, normalization="RMSNorm")
    gpt = GPTModel(
        moe, spec, vocab_size=layout.rows, max_sequence_length=64, position_embedding_type="rope"
    )
    state = hf_to_megatron(load_file(str(tmp_path / "model.safetensors")), layout)
    missing, unexpected = gpt.load_state_dict(state, strict=False)
    assert [name for name in missing if not name.endswith("_extra_state")] == []
    assert unexpected == []


def test_the_megatron_trainer_keeps_float32_master_weights_and_publishes_bfloat16() -> None:
    """As the torch engine's trainer does (test_master_weights.py): with model.dtype
    bfloat16 the scorers hold bfloat16, the trainer float32, and a step at an RL learning
    rate moves weights that bfloat16 would not, while what it publishes is bfloat16."""
    from asyncrl.actors._learner import Group, Learner
    from asyncrl.actors._setup import load_policy
    from asyncrl.runtime.config import config_from_dict
    from tests.bench.train_memory import synthetic_lease

    cfg = config_from_dict(
        {
            "model": {"dtype": "bfloat16"},
            "algorithm": {"lr": 1e-6},
            "backends": {"train": "megatron"},
        }
    )
    scorer, _ = load_policy(cfg, "logp")
    assert {p.dtype for p in scorer.parameters()} == {torch.bfloat16}
    model, codec = load_policy(cfg, "train")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    learner = Learner(model, cfg, pad_id=codec.pad_id)
    before = weights_of(model)
    lease = synthetic_lease(model.config.vocab_size, 8, 8, groups=2, responses=4)
    learner.step([Group.of(item) for item in lease.items])
    after = weights_of(model)
    moved = sum(int((after[n] != before[n]).sum()) for n in before)
    kept_only_in_float32 = sum(
        int(((after[n] != before[n]) & (after[n].bfloat16() == before[n].bfloat16())).sum())
        for n in before
    )
    assert moved > 0 and kept_only_in_float32 > moved // 2
    published = learner.full_weights()
    assert {t.dtype for t in published.values()} == {torch.bfloat16}
    assert all(torch.equal(published[n], after[n].bfloat16()) for n in published)
