"""Flattened weight buckets for SGLang: exact round trips, the size limit, tied embeddings."""

from __future__ import annotations

import pytest
import torch

from asyncrl.actors.engines.sglang.buckets import (
    EMBEDDING,
    OUTPUT,
    build_buckets,
    iter_buckets,
    rebuild,
)

MiB = 1 << 20


def mixed_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        EMBEDDING: torch.randn(50, 16, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, dtype=torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.randn(16, dtype=torch.float32),
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, dtype=torch.bfloat16),
        "model.layers.0.post_attention_layernorm.weight": torch.randn(16),
        "model.norm.weight": torch.randn(16, dtype=torch.float16),
        OUTPUT: torch.randn(50, 16, dtype=torch.bfloat16),
    }


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_buckets_rebuild_every_weight_exactly_across_dtypes() -> None:
    state = mixed_state()
    buckets = build_buckets(state, 1024, tied_embeddings=False)
    rebuilt = rebuild(buckets, tied_embeddings=False)
    assert set(rebuilt) == set(state)
    for name, tensor in state.items():
        assert rebuilt[name].dtype == tensor.dtype and rebuilt[name].shape == tensor.shape
        assert torch.equal(rebuilt[name], tensor), name
    for bucket in buckets:  # one dtype per flat tensor, entries as SGLang's metadata says
        assert bucket.flat.dim() == 1
        assert all(entry.dtype == bucket.flat.dtype for entry in bucket.entries)
        fields = bucket.entries[0].fields()
        assert set(fields) == {"name", "shape", "dtype", "start_idx", "end_idx", "numel"}
        assert fields["numel"] == fields["end_idx"] - fields["start_idx"]


def test_buckets_keep_within_the_size_limit_and_the_state_order_per_dtype() -> None:
    state = mixed_state()
    limit = 2 * 16 * 16 * 2  # two 16x16 bf16 weights
    buckets = build_buckets(state, limit, tied_embeddings=False)
    for bucket in buckets:
        if len(bucket.entries) > 1:
            assert bucket.nbytes <= limit
        else:  # a weight larger than the limit goes alone
            assert bucket.nbytes == nbytes(state[bucket.entries[0].name])
    assert any(len(b.entries) > 1 for b in buckets)
    oversized = [n for n, t in state.items() if nbytes(t) > limit]
    assert oversized and all(
        any(len(b.entries) == 1 and b.entries[0].name == n for b in buckets) for n in oversized
    )
    bf16 = [e.name for b in buckets if b.flat.dtype == torch.bfloat16 for e in b.entries]
    assert bf16 == [n for n, t in state.items() if t.dtype == torch.bfloat16]


def test_one_large_bucket_per_dtype_when_the_limit_allows() -> None:
    buckets = build_buckets(mixed_state(), 64 * MiB, tied_embeddings=False)
    assert sorted(str(b.flat.dtype) for b in buckets) == [
        "torch.bfloat16",
        "torch.float16",
        "torch.float32",
    ]


def test_tied_embeddings_are_sent_once_and_tied_again() -> None:
    state = mixed_state()
    state[OUTPUT] = state[EMBEDDING]  # as a tied model holds them
    buckets = build_buckets(state, 64 * MiB, tied_embeddings=True)
    sent = [e.name for b in buckets for e in b.entries]
    assert OUTPUT not in sent and sent.count(EMBEDDING) == 1
    rebuilt = rebuild(buckets, tied_embeddings=True)
    assert torch.equal(rebuilt[OUTPUT], state[EMBEDDING])
    assert rebuilt[OUTPUT].data_ptr() == rebuilt[EMBEDDING].data_ptr()


def test_a_tied_state_as_the_weight_plane_delivers_it_has_no_output_layer() -> None:
    state = mixed_state()
    del state[OUTPUT]  # state_for_saving stores a tied output layer once, as HF does
    rebuilt = rebuild(build_buckets(state, 4096, tied_embeddings=True), tied_embeddings=True)
    assert set(rebuilt) == set(state) | {OUTPUT}


def test_an_untied_state_without_its_output_layer_is_refused() -> None:
    state = mixed_state()
    del state[OUTPUT]
    with pytest.raises(ValueError, match="lm_head"):
        build_buckets(state, 4096, tied_embeddings=False)
    with pytest.raises(ValueError, match="embed_tokens"):
        build_buckets({"model.norm.weight": torch.ones(2)}, 4096, tied_embeddings=True)


def test_buckets_are_copies_made_one_at_a_time() -> None:
    state = mixed_state()
    buckets = iter_buckets(state, 1024, tied_embeddings=False)
    first = next(buckets)
    name = first.entries[0].name
    before = state[name].clone()
    state[name].add_(1)  # a receiver's buffer reused for the next version
    assert torch.equal(first.tensors()[name], before)
    assert len(list(buckets)) >= 1
