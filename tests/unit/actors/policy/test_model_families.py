"""Every supported family computes what transformers computes, through both ways in.

Tiny random models are made by transformers and saved as on the hub; our loader reads
them, and the logits must agree to 1e-5 in float32: over whole sequences (``forward``,
what train and logp run) and token by token against the KV cache (``step``, what the
decoder runs), with rows at different positions. Our own save must load back in
transformers as the same class with the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model, save_model
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from tests.support.hf_families import SMALL, VARIANTS, hf_model, hf_model_dir, save_hf_model

transformers = pytest.importorskip("transformers")

TOKENS = 12  # longer than every sliding window in VARIANTS
TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def sequences(rows: int = 3, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL["vocab_size"], (rows, TOKENS), generator=generator)


def stepped_logits(model: CausalLM, ids: torch.Tensor, prefill: list[int]) -> torch.Tensor:
    """Logits of every position of ``ids`` from ``step``: row r's first ``prefill[r]``
    tokens in one right-padded call, then one token per call for the rows not yet done."""
    rows, tokens = ids.shape
    cache = model.new_cache(slots=rows, max_len=tokens + 1)
    out = torch.zeros(rows, tokens, model.config.vocab_size)
    pad = cache.max_len - 1  # as the decoder pads: a position no real token reaches
    positions = torch.full((rows, max(prefill)), pad)
    batch = torch.zeros(rows, max(prefill), dtype=torch.long)
    for r, n in enumerate(prefill):
        positions[r, :n], batch[r, :n] = torch.arange(n), ids[r, :n]
    logits = model.step(batch, positions, torch.arange(rows), cache)
    for r, n in enumerate(prefill):
        out[r, :n] = logits[r, :n]
    for position in range(min(prefill), tokens):
        live = [r for r, n in enumerate(prefill) if n <= position]  # not always consecutive
        slots = torch.tensor(live)
        logits = model.step(
            ids[live, position : position + 1], torch.full((len(live), 1), position), slots, cache
        )
        out[live, position] = logits[:, 0]
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_equal_transformers_through_forward_and_the_kv_cache(
    tmp_path: Path, variant: str
) -> None:
    directory = hf_model_dir(tmp_path / variant, variant)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    ours, _ = load_model(str(directory))
    ids = sequences()
    with torch.no_grad():
        expected = theirs(ids).logits
        whole = ours(ids)
        stepped = stepped_logits(ours, ids, prefill=[5, 1, 8])
    assert (whole - expected).abs().max() <= TOLERANCE
    assert (stepped - expected).abs().max() <= TOLERANCE


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_our_save_loads_in_transformers_as_the_same_class(tmp_path: Path, variant: str) -> None:
    source = hf_model_dir(tmp_path / "source", variant)
    ours, _ = load_model(str(source))
    save_model(ours, source, tmp_path / "saved")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert type(theirs).__name__ == written["architectures"][0] == ours.config.architecture
    assert ModelConfig.from_hf(written) == ours.config
    ids = sequences()
    with torch.no_grad():
        assert (ours(ids) - theirs(ids).logits).abs().max() <= TOLERANCE


def test_a_sharded_checkpoint_loads(tmp_path: Path) -> None:
    model = hf_model("qwen3", head_dim=12, tie_word_embeddings=False)
    directory = save_hf_model(model, tmp_path / "sharded", max_shard_size="20KB")
    assert (directory / "model.safetensors.index.json").is_file()
    assert len(list(directory.glob("model-*.safetensors"))) > 1
    ours, _ = load_model(str(directory))
    ids = sequences()
    with torch.no_grad():
        assert (ours(ids) - model(ids).logits).abs().max() <= TOLERANCE


def test_the_sliding_window_changes_the_logits(tmp_path: Path) -> None:
    """The window is honoured, not merely accepted: without it, the logits differ."""
    directory = hf_model_dir(tmp_path / "mistral", "mistral-sliding")
    ours, _ = load_model(str(directory))
    config = json.loads((directory / "config.json").read_text()) | {"sliding_window": None}
    unwindowed = CausalLM(ModelConfig.from_hf(config))
    unwindowed.load_state_dict(ours.state_dict())
    ids = sequences()
    with torch.no_grad():
        assert (ours(ids) - unwindowed(ids)).abs().max() > 1e-3


def test_in_bfloat16_rotary_stays_float32_as_in_transformers(tmp_path: Path) -> None:
    """Cast to bfloat16, the frequencies would drift by radians at long positions."""
    directory = hf_model_dir(tmp_path / "llama3", "llama3-rope-untied-biases")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    ours, _ = load_model(str(directory), torch.bfloat16)
    assert ours.rotary.inv_freq.dtype == torch.float32
    ids = torch.randint(
        0, SMALL["vocab_size"], (2, 100), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        difference = (ours(ids).float() - theirs.eval()(ids).logits.float()).abs().max()
    assert difference <= 1e-2  # 0 here; 5e-2 with bfloat16 frequencies
