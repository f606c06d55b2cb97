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

from asyncrl.actors.engines.contract import device_of, load_weights, weights_of
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.runtime.contract.config import MegatronSection
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


@pytest.mark.parametrize("variant", ["qwen3-moe", "qwen3-moe-unnormalised-tied"])
def test_a_mixture_of_experts_trains_as_the_torch_engines(variant: str, tmp_path: Path) -> None:
    """The router's and the experts' gradients of one loss, against the torch engine's
    (the logits are checked against transformers above): megatron's MoE layer computes on
    CPU with our router, routes as transformers does, and back-propagates through it."""
    directory = hf_model_dir(tmp_path, variant)
    ours, _ = load_model(str(directory))
    model, _ = load(str(directory))
    ids = torch.randint(0, SMALL["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(3))
    columns = torch.arange(2, 9).expand(2, 7)
    targets = torch.randint(0, SMALL["vocab_size"], (2, 7), generator=torch.Generator())
    for m in (ours, model):
        picked = torch.log_softmax(m(ids, columns), dim=-1).gather(-1, targets[..., None])
        picked.mean().backward()
    for layer in range(SMALL["num_hidden_layers"]):
        mine, theirs = ours.model.layers[layer].mlp, model.gpt.decoder.layers[layer].mlp
        pairs = [(mine.gate.weight.grad, theirs.router.weight.grad)]
        for e, expert in enumerate(theirs.experts.local_experts):
            hf = mine.experts[e]
            if hf.down_proj.weight.grad is None:  # no token chose this expert
                assert (
                    expert.linear_fc2.weight.grad is None or not expert.linear_fc2.weight.grad.any()
                )
                continue
            pairs.append((hf.down_proj.weight.grad, expert.linear_fc2.weight.grad))
            fused = torch.cat((hf.gate_proj.weight.grad, hf.up_proj.weight.grad))
            pairs.append((fused, expert.linear_fc1.weight.grad))
        for expected, got in pairs:
            assert (got - expected).abs().max() <= 1e-5


def test_the_megatron_trainer_keeps_float32_master_weights_and_publishes_bfloat16() -> None:
    """As the torch engine's trainer does (test_master_weights.py): with model.dtype
    bfloat16 the scorers hold bfloat16, the trainer float32, and a step at an RL learning
    rate moves weights that bfloat16 would not, while what it publishes is bfloat16."""
    from asyncrl.actors.startup.model_loading import load_policy
    from asyncrl.actors.training.learner import Group, Learner
    from asyncrl.runtime.contract.config import config_from_dict
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


def test_the_megatron_trainer_takes_mini_batches_and_the_schedule_as_the_torch_one() -> None:
    """The rate is set on the megatron trainer's AdamW as on the torch one's, and its
    updates (two mini-batches, two epochs) move the weights the same way."""
    from asyncrl.actors.startup.model_loading import load_policy
    from asyncrl.actors.training.learner import Group, Learner
    from asyncrl.runtime.contract.config import config_from_dict
    from tests.integration.test_train_group import _lease

    schedule = {"kind": "linear", "warmup_steps": 4}
    algorithm = {"lr": 1e-3, "mini_batches": 2, "epochs": 2, "lr_schedule": schedule}
    groups = [Group.of(item) for item in _lease(seed=3, groups=4, responses=4).items]
    after = {}
    for engine in ("torch", "megatron"):
        cfg = config_from_dict(
            {
                "algorithm": algorithm,
                "backends": {"train": engine},
                "pipeline": {"train_batch_groups": 4},
            }
        )
        model, codec = load_policy(cfg, "train")
        learner = Learner(model, cfg, pad_id=codec.pad_id)
        stats = learner.step(groups, steps_done=1)
        assert stats.metrics["updates"] == 4 and stats.metrics["lr"] == pytest.approx(5e-4)
        assert {g["lr"] for g in learner.optimizer.param_groups} == {stats.metrics["lr"]}
        after[engine] = weights_of(model)
    for name, expected in after["torch"].items():
        assert (after["megatron"][name] - expected).abs().max() <= 1e-5, name


@pytest.mark.parametrize("variant", ["qwen3-moe", "qwen3-moe-unnormalised-tied"])
def test_megatron_replays_recorded_routes_as_the_torch_engine(variant: str, tmp_path: Path) -> None:
    """Router replay through megatron's RouterReplay: every token forced through experts
    its router would not all choose, the log-probs and the routers' gradients as the torch
    engine's under the same routes."""
    from asyncrl.actors.policy.scoring import pack, response_logprobs

    directory = hf_model_dir(tmp_path, variant)
    ours, _ = load_model(str(directory))
    model, _ = load(str(directory))
    draw = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 40, (n,), generator=draw).tolist() for n in (4, 6, 3)]
    responses = [torch.randint(2, 40, (n,), generator=draw).tolist() for n in (5, 2, 7)]
    experts = 4 if variant == "qwen3-moe" else 3
    routes = [
        torch.rand(len(p) + len(r), SMALL["num_hidden_layers"], experts, generator=draw)
        .argsort(-1)[..., :2]
        .to(torch.int16)
        for p, r in zip(prompts, responses, strict=True)
    ]
    replayed = pack(prompts, responses, 0, routes=routes)
    plain = pack(prompts, responses, 0)
    mine, theirs = response_logprobs(ours, replayed), response_logprobs(model, replayed)
    assert (mine - theirs).abs().max() <= TOLERANCE
    assert (mine - response_logprobs(ours, plain)).abs().max() > 1e-3  # the routes mattered
    mine.sum().backward()
    theirs.sum().backward()
    for layer in range(SMALL["num_hidden_layers"]):
        expected = ours.model.layers[layer].mlp.gate.weight.grad
        got = model.gpt.decoder.layers[layer].mlp.router.weight.grad
        assert expected.abs().sum() > 0 and (got - expected).abs().max() <= 1e-5
