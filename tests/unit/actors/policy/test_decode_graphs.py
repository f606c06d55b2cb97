"""What a decode step captured in a CUDA graph computes, checked on CPU: the step with a
fixed span over the whole cache (masked beyond each row's position, padding rows in a
spare slot) gives the logits of the step that reads its span from the positions. The
capture and replay themselves run on a GPU only (tests/gpu/test_cuda.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.graphs import GraphedSteps, batch_sizes
from tests.support.hf_families import hf_model_dir

PROMPT = 9


def _prefilled(model, slots: int):
    cache = model.new_cache(slots + 1, max_len=24)  # the last slot: padding's scratch
    ids = torch.randint(3, model.config.vocab_size, (slots, PROMPT))
    positions = torch.arange(PROMPT).expand(slots, PROMPT)
    model.step(ids, positions, torch.arange(slots), cache)
    return cache


@pytest.mark.parametrize("variant", ["mistral-sliding", "qwen3"])
def test_a_fixed_span_step_with_padding_rows_equals_the_plain_step(
    tmp_path: Path, variant: str
) -> None:
    model, _ = load_model(str(hf_model_dir(tmp_path, variant)))
    torch.manual_seed(0)
    with torch.no_grad():
        cache = _prefilled(model, 3)
        twin = model.new_cache(4, max_len=24)
        twin.keys.copy_(cache.keys)
        twin.values.copy_(cache.values)
        # Rows 2 and 0 (not in slot order, as a graph's buffers may hold them), each at
        # its own next position, then a padding row in the scratch slot at the last one.
        ids = torch.tensor([[5], [7]])
        positions = torch.tensor([[PROMPT], [PROMPT - 2]])
        slots = torch.tensor([2, 0])
        plain = model.step(ids, positions, slots, cache)
        padded = model.step(
            torch.tensor([[5], [7], [0]]),
            torch.cat([positions, torch.tensor([[23]])]),
            torch.tensor([2, 0, 3]),
            twin,
            span=24,
        )
    assert (padded[:2] - plain).abs().max() <= 1e-5
    # Every sequence's cache is as the plain step left it; only the scratch slot differs.
    assert torch.allclose(twin.keys[:, :3], cache.keys[:, :3], atol=1e-6)


def test_batch_sizes_cover_every_count_of_rows() -> None:
    assert batch_sizes(1) == [1]
    assert batch_sizes(6) == [1, 2, 4, 6]
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    for slots in (1, 5, 64, 100):
        sizes = batch_sizes(slots)
        assert all(any(s >= rows for s in sizes) for rows in range(1, slots + 1))


def test_graphed_steps_want_the_scratch_slot() -> None:
    model, _ = load_model("embedded")
    with pytest.raises(ValueError, match="need slots \\+ 1"):
        GraphedSteps(model, model.new_cache(4, max_len=8), slots=4)
