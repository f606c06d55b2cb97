"""The megatron weight mapping: Hugging Face -> megatron -> Hugging Face gives back the
same tensors, for each family, whole and split over tensor-, expert- and pipeline-parallel
ranks. The Hugging Face side is what transformers itself writes (``save_pretrained``),
so the names and layouts are the hub's, not ours.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from asyncrl.actors.engines.megatron import mapping as m
from asyncrl.actors.engines.megatron import parallel as par
from tests.support.hf_families import hf_model

pytest.importorskip("transformers")

# Four query heads over two kv heads (so a query group has two), every switch of a family.
FAMILIES = {
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-untied-biases": (
        "llama",
        {"tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True},
    ),
    "qwen2": ("qwen2", {"tie_word_embeddings": False}),
    "qwen3": ("qwen3", {"tie_word_embeddings": True, "head_dim": 12}),
    "qwen3-moe": (
        "qwen3_moe",
        {
            "tie_word_embeddings": False,
            "head_dim": 12,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
        },
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved(request, tmp_path_factory) -> tuple[dict, dict[str, torch.Tensor]]:
    """A family's config.json and weights as transformers saves them."""
    model_type, fields = FAMILIES[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    hf_model(model_type, **fields).save_pretrained(directory)
    config = json.loads((Path(directory) / "config.json").read_text())
    return config, load_file(str(Path(directory) / "model.safetensors"))


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def test_hf_to_megatron_and_back_gives_the_same_tensors(saved) -> None:
    config, hf = saved
    layout = m.Layout.from_hf(config)
    back = m.megatron_to_hf(m.hf_to_megatron(hf, layout), layout)
    assert_same(back, hf)


def test_the_fused_qkv_is_laid_out_per_query_group(saved) -> None:
    config, hf = saved
    layout = m.Layout.from_hf(config)
    fused = m.hf_to_megatron(hf, layout)["decoder.layers.1.self_attention.linear_qkv.weight"]
    d, q = layout.head_dim, hf["model.layers.1.self_attn.q_proj.weight"]
    k, v = (
        hf["model.layers.1.self_attn.k_proj.weight"],
        hf["model.layers.1.self_attn.v_proj.weight"],
    )
    # Group 1 (the second kv head): query heads 2 and 3, then key head 1, then value head 1.
    group = fused[4 * d : 8 * d]
    assert torch.equal(group[: 2 * d], q[2 * d : 4 * d])
    assert torch.equal(group[2 * d : 3 * d], k[d : 2 * d])
    assert torch.equal(group[3 * d :], v[d : 2 * d])


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_tensor_parallel_split_merges_back_and_each_rank_has_whole_groups(saved, ranks) -> None:
    config, hf = saved
    layout = m.Layout.from_hf(config).padded_for(ranks)
    whole = m.hf_to_megatron(hf, layout)
    shards = par.split_tensor_parallel(whole, ranks)
    assert_same(m.megatron_to_hf(par.merge_tensor_parallel(shards), layout), hf)
    # Rank r's fc1 shard is [its gate rows; its up rows], its qkv its query groups whole.
    gate = hf["model.layers.0.mlp.gate_proj.weight"] if not layout.experts else None
    d, groups = layout.head_dim, layout.kv_heads // ranks
    for rank, shard in enumerate(shards):
        qkv = shard["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert qkv.shape[0] == groups * (layout.heads // layout.kv_heads + 2) * d
        if gate is not None:
            fc1 = shard["decoder.layers.0.mlp.linear_fc1.weight"]
            rows = layout.ffn // ranks
            assert torch.equal(fc1[:rows], gate[rank * rows : (rank + 1) * rows])


def test_an_odd_vocabulary_is_padded_for_the_split_and_unpadded_back(saved) -> None:
    config, hf = saved
    config = {**config, "vocab_size": config["vocab_size"] - 1}
    hf = {
        name: t[:-1] if name in ("model.embed_tokens.weight", "lm_head.weight") else t
        for name, t in hf.items()
    }
    layout = m.Layout.from_hf(config).padded_for(2)
    whole = m.hf_to_megatron(hf, layout)
    assert whole[m.EMBEDDING].shape[0] == layout.vocab + 1
    assert not whole[m.EMBEDDING][-1].any()  # padding rows are zeros
    merged = par.merge_tensor_parallel(par.split_tensor_parallel(whole, 2))
    assert_same(m.megatron_to_hf(merged, layout), hf)


def test_expert_and_pipeline_splits_merge_back(saved) -> None:
    config, hf = saved
    layout = m.Layout.from_hf(config)
    whole = m.hf_to_megatron(hf, layout)
    stages = par.split_pipeline_parallel(whole, layout, 2)
    assert "decoder.layers.0.input_layernorm.weight" in stages[1]  # layer 1, numbered 0
    assert m.EMBEDDING in stages[0] and m.FINAL_NORM in stages[1]
    assert_same(par.merge_pipeline_parallel(stages, layout), whole)
    if layout.experts:
        parts = par.split_expert_parallel(whole, 2)
        assert "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight" in parts[1]
        assert "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight" not in parts[1]
        assert_same(par.merge_expert_parallel(parts), whole)


def test_transformer_engine_names_convert_both_ways(saved) -> None:
    config, hf = saved
    layout = m.Layout.from_hf(config)
    whole = m.hf_to_megatron(hf, layout)
    te = m.to_te_names(whole, layout)
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in te
    assert_same(m.from_te_names(te, layout), whole)


def test_a_missing_or_unexpected_tensor_is_named(saved) -> None:
    config, hf = saved
    layout = m.Layout.from_hf(config)
    with pytest.raises(KeyError, match=r"model\.norm\.weight"):
        m.hf_to_megatron({k: t for k, t in hf.items() if k != "model.norm.weight"}, layout)
    with pytest.raises(ValueError, match=r"extra\.weight"):
        m.hf_to_megatron({**hf, "extra.weight": torch.zeros(1)}, layout)


# (tensor, stages, experts): each split alone, and all three (experts: mixtures only).
SLICED = [(2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2), (2, 2, 2)]


@pytest.mark.parametrize("odd_vocabulary", [False, True])
def test_each_ranks_slice_by_hugging_face_name_makes_the_whole_as_parts(
    saved, odd_vocabulary: bool
) -> None:
    """What each rank of a split model publishes as its part of a version (slice_to_hf),
    announced and assembled as the weight plane does, is the whole Hugging Face state;
    no tensor is published twice."""
    config, hf = saved
    if odd_vocabulary:  # padded for the split: the padding rows are not published
        config = {**config, "vocab_size": config["vocab_size"] - 1}
        hf = {
            name: t[:-1] if name in ("model.embed_tokens.weight", "lm_head.weight") else t
            for name, t in hf.items()
        }
    for tensor, stages, experts in SLICED:
        if experts == 1 or m.Layout.from_hf(config).experts:
            _slices_make_the_whole(config, hf, tensor, stages, experts)


def _slices_make_the_whole(
    config: dict, hf: dict[str, torch.Tensor], tensor: int, stages: int, experts: int
) -> None:
    from asyncrl.transport.weights.base import Announcement
    from asyncrl.transport.weights.layout import Manifest, plan
    from asyncrl.transport.weights.parts import assemble, compose, split_dims

    layout = m.Layout.from_hf(config).padded_for(tensor)
    per_stage = layout.layers // stages
    slices, dims = [], {}
    whole_mg = m.hf_to_megatron(hf, layout)
    for stage, part in enumerate(par.split_pipeline_parallel(whole_mg, layout, stages)):
        for expert, block in enumerate(par.split_expert_parallel(part, experts)):
            for rank, shard in enumerate(par.split_tensor_parallel(block, tensor)):
                first = stage * per_stage
                mine, split = m.slice_to_hf(shard, layout, rank, tensor, first, expert, experts)
                slices.append(mine)
                dims.update(split)
    announced = []
    for index, mine in enumerate(slices):
        specs, total = plan(mine)
        manifest = Manifest(1, specs, total, 1 << 20, (0,) * max(1, -(-total // (1 << 20))))
        announced.append(Announcement(1, manifest.to_payload(), f"rank-{index}".encode()))
    shapes = {name: tuple(t.shape) for name, t in hf.items()}
    if layout.tied:
        shapes.pop("lm_head.weight", None)
    whole = compose(1, announced, shapes, dims)  # refuses parts that do not make the whole
    assert_same(assemble(slices, shapes, split_dims(whole.manifest)), {n: hf[n] for n in shapes})
