"""Router replay on a tiny Qwen3-MoE: the decoder records each token's experts, and a
scorer that replays them routes every token as the generator did; the gates' weights still
come from the scorer's own router, which gets a gradient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Finished, Request
from asyncrl.actors.policy.model import CausalLM, Routing
from asyncrl.actors.policy.scoring import Packed, pack, response_logprobs, response_positions
from tests.support.hf_families import hf_model_dir

PROMPTS = 32


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> Path:
    return hf_model_dir(tmp_path_factory.mktemp("moe"), "qwen3-moe")  # 4 experts, 2 a token


def generate(model: CausalLM) -> list[Finished]:
    decoder = Decoder(
        model,
        slots=8,
        max_new_tokens=16,
        max_prompt_tokens=16,
        eos_id=1,
        pad_id=0,
        seed=1,
        record_routes=True,
    )
    draw = torch.Generator().manual_seed(3)
    for tag in range(PROMPTS):
        length = int(torch.randint(3, 10, (1,), generator=draw))
        decoder.submit(
            [Request(tag, tuple(torch.randint(2, 40, (length,), generator=draw).tolist()))]
        )
    finished: list[Finished] = []
    while decoder.busy:
        finished += decoder.step()
    return sorted(finished, key=lambda f: f.tag)


def packed(finished: list[Finished], replay: bool) -> Packed:
    records = [torch.from_numpy(f.routes.astype(np.int16)) for f in finished] if replay else None
    return pack([f.prompt for f in finished], [f.tokens for f in finished], 0, routes=records)


def behaviour(finished: list[Finished], like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    for row, f in enumerate(finished):
        out[row, : len(f.logprobs)] = torch.tensor(f.logprobs)
    return out


def routes_taken(model: CausalLM, batch: Packed, replay: bool) -> torch.Tensor:
    """The experts each read token went through, [rows, tokens, layers, per_token]."""
    inputs, _, _ = response_positions(batch, torch.device("cpu"))
    routing = batch.routing(torch.device("cpu")) if replay else Routing()
    routing.recorded = []
    with torch.no_grad():
        model(inputs, routing=routing)
    return torch.stack(routing.recorded, dim=2)


def route_mismatches(finished: list[Finished], taken: torch.Tensor) -> int:
    """(token, layer) pairs whose set of experts differs from the generator's record."""
    differ = 0
    for row, f in enumerate(finished):
        recorded = torch.from_numpy(f.routes.astype(np.int64)).sort(-1).values
        mine = taken[row, : len(f.routes)].sort(-1).values
        differ += int((recorded != mine).any(-1).sum())
    return differ


def test_the_decoder_records_every_read_token_and_matches_its_own_forward(moe_dir: Path) -> None:
    model, _ = load_model(str(moe_dir))
    finished = generate(model)
    for f in finished:
        # Every token the model read: the prompt and the response but its last token.
        assert f.routes is not None and f.routes.dtype == np.uint8
        assert f.routes.shape == (len(f.prompt) + len(f.tokens) - 1, 2, 2)
    # The same weights and dtype: the whole-sequence forward routes as the decoder did.
    assert route_mismatches(finished, routes_taken(model, packed(finished, False), False)) == 0


def perturbed_generator(moe_dir: Path, how: str) -> CausalLM:
    """The generator's model: in bfloat16, or in float32 with noise of 1% of each router's
    mean weight on its weights (numerics that differ in the routing alone)."""
    if how == "bfloat16":
        return load_model(str(moe_dir), torch.bfloat16)[0]
    model, _ = load_model(str(moe_dir), torch.float32)
    noise = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in model.model.layers:
            weight = layer.mlp.gate.weight
            weight.add_(0.01 * weight.abs().mean() * torch.randn(weight.shape, generator=noise))
    return model


def k3(gaps: torch.Tensor) -> float:
    """The k3 estimate of KL(generator || scorer) from ``scorer - generator`` log-prob
    gaps of tokens the generator sampled, as the step lines' logprob_mismatch_kl."""
    return float((torch.expm1(gaps) - gaps).mean())


@pytest.mark.parametrize("how", ["bfloat16", "router-noise"])
def test_replay_closes_the_gap_of_a_generator_with_other_numerics(moe_dir: Path, how: str) -> None:
    scorer, _ = load_model(str(moe_dir), torch.float32)
    finished = generate(perturbed_generator(moe_dir, how))
    plain, replayed = packed(finished, False), packed(finished, True)
    with torch.no_grad():
        without = response_logprobs(scorer, plain)
        with_replay = response_logprobs(scorer, replayed)
    real = plain.mask > 0
    sampled = behaviour(finished, without)
    gap = (without - sampled).abs()[real]
    gap_replayed = (with_replay - sampled).abs()[real]
    kl, kl_replayed = (k3((d - sampled)[real].double()) for d in (without, with_replay))
    flipped = route_mismatches(finished, routes_taken(scorer, plain, False))
    replay_flipped = route_mismatches(finished, routes_taken(scorer, replayed, True))
    pairs = sum(len(f.routes) for f in finished) * 2
    print(
        f"\n{how} generator, {int(real.sum())} tokens; (token, layer) routes unlike the "
        f"generator's: {flipped} of {pairs} without replay, {replay_flipped} with; |log-prob gap| "
        f"without replay mean {gap.mean():.3e} max {gap.max():.3e}, with replay mean "
        f"{gap_replayed.mean():.3e} max {gap_replayed.max():.3e}: the max "
        f"{gap.max() / gap_replayed.max():.1f}x smaller, the mean "
        f"{gap.mean() / gap_replayed.mean():.1f}x; k3 KL {kl:.3e} -> {kl_replayed:.3e} "
        f"({kl / kl_replayed:.1f}x)"
    )
    assert flipped > 0 and replay_flipped == 0
    # The gap as the runs measure it (k3 KL, logprob_mismatch_kl) and its worst token fall
    # 10x; the mean |gap| less (1.7x in bfloat16): most tokens' gap is the rest of the
    # numerics, which replay leaves alone.
    assert kl >= 10 * kl_replayed
    assert gap.max() >= 10 * gap_replayed.max()
    assert gap.mean() > gap_replayed.mean()


def test_replay_with_the_routers_own_choice_changes_nothing_and_trains_the_router(
    moe_dir: Path,
) -> None:
    model, _ = load_model(str(moe_dir))
    finished = generate(model)
    plain, replayed = packed(finished, False), packed(finished, True)
    with torch.no_grad():
        torch.testing.assert_close(
            response_logprobs(model, replayed), response_logprobs(model, plain), rtol=0, atol=1e-5
        )
    response_logprobs(model, replayed).sum().backward()
    for layer in model.model.layers:
        grad = layer.mlp.gate.weight.grad
        assert grad is not None and grad.abs().sum() > 0  # the router keeps learning


def generate_across_a_reload(model: CausalLM, newer: dict, rows: int) -> list[Finished]:
    """``rows`` sequences recording their routes, ``newer`` loaded after six steps (mid-
    sequence), decoded to their ends; sorted by tag."""
    decoder = Decoder(
        model, slots=rows, max_new_tokens=12, max_prompt_tokens=16, eos_id=-1, pad_id=0,
        record_routes=True,
    )  # fmt: skip
    decoder.submit([Request(tag, (5 + tag, 7, 9, 11, 13)) for tag in range(rows)])
    finished: list[Finished] = []
    for _ in range(6):
        finished += decoder.step()
    decoder.load(newer, version=1)
    while decoder.busy:
        finished += decoder.step()
    return sorted(finished, key=lambda f: f.tag)


def test_a_reload_records_the_new_versions_routes(moe_dir: Path) -> None:
    """Weights that change mid-sequence: the cached tokens are read again under the new
    version, and the record is that version's, as the trainer of that version routes."""
    model, _ = load_model(str(moe_dir))
    newer = perturbed_generator(moe_dir, "router-noise").state_dict()
    finished = generate_across_a_reload(model, newer, rows=4)
    assert {v for f in finished for v in f.versions} == {0, 1}
    # The decoder's model now holds the new weights: its whole-sequence forward routes
    # every token as the record says.
    taken = routes_taken(model, packed(finished, False), False)
    assert route_mismatches(finished, taken) == 0


def test_routes_of_another_shape_are_refused_by_name(moe_dir: Path) -> None:
    model, _ = load_model(str(moe_dir))
    three_a_token = [torch.zeros(6, 2, 3, dtype=torch.int16)]
    batch = pack([(5, 6, 7)], [(8, 9, 1, 1)], 0, routes=three_a_token)
    with pytest.raises(ValueError, match=r"routes recorded for 2 layers x 3 experts a token; "):
        response_logprobs(model, batch)


def test_an_unnormalising_model_replays_its_own_choice_unchanged(tmp_path: Path) -> None:
    """norm_topk_prob false: the replayed experts' weights are the router's probabilities
    as they are, not renormalised over the chosen ones."""
    model, _ = load_model(str(hf_model_dir(tmp_path, "qwen3-moe-unnormalised-tied")))
    finished = generate(model)
    with torch.no_grad():
        torch.testing.assert_close(
            response_logprobs(model, packed(finished, True)),
            response_logprobs(model, packed(finished, False)),
            rtol=0,
            atol=1e-5,
        )


def test_a_sequence_spanning_a_reload_replays_exactly_under_the_newer_version(
    moe_dir: Path,
) -> None:
    """The record holds the newer version's routes for the whole prefix: scored under the
    newer version with replay, its tokens' log-probs are the generator's; under the older
    one, the older tokens' are not (the engine gap shows it)."""
    older, _ = load_model(str(moe_dir))
    newer = perturbed_generator(moe_dir, "router-noise")
    generator, _ = load_model(str(moe_dir))
    finished = generate_across_a_reload(generator, newer.state_dict(), rows=8)
    batch = packed(finished, True)
    sampled = behaviour(finished, batch.mask)
    versions = torch.zeros_like(batch.mask)
    for row, f in enumerate(finished):
        versions[row, : len(f.versions)] = torch.tensor(f.versions, dtype=torch.float32)
    gaps = {}
    with torch.no_grad():
        for version, model in ((0, older), (1, newer)):
            gap = (response_logprobs(model, batch) - sampled).abs()[versions == version]
            gaps[version] = float(gap.max())
    print(f"\nmax |gap| of each version's tokens under that version, replayed: {gaps}")
    assert gaps[1] < 1e-5 < gaps[0]
