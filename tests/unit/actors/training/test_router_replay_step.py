"""The trainer replays the routes a group carries: a step's importance ratios against the
generator's log-probs are 1 when it routes as the generator did, and not when the group's
record names other experts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.actors.payloads import LogprobsOut, RolloutsOut, Sampled
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.runtime.contract.config import config_from_dict
from tests.support.hf_families import hf_model_dir


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> Path:
    return hf_model_dir(tmp_path_factory.mktemp("moe"), "qwen3-moe")


def group(moe_dir: Path) -> Group:
    """Eight responses to one prompt, their routes recorded, the generator's log-probs
    standing as the proximal ones (same weights, same version)."""
    model, _ = load_model(str(moe_dir))
    decoder = Decoder(
        model, slots=8, max_new_tokens=10, max_prompt_tokens=8, eos_id=1, pad_id=0, seed=2,
        record_routes=True,
    )  # fmt: skip
    decoder.submit([Request(tag, (5, 7, 9, 11)) for tag in range(8)])
    finished = []
    while decoder.busy:
        finished += decoder.step()
    sequences = [
        Sampled(
            [*f.prompt, *f.tokens],
            [0.0] * len(f.prompt) + f.logprobs,
            [0] * len(f.prompt) + f.versions,
            [False] * len(f.prompt) + [True] * len(f.tokens),
            routes=f.routes,
        )
        for f in finished
    ]
    rollouts = RolloutsOut.from_sequences(sequences)
    rewards = np.arange(8, dtype=np.float32) / 8
    return Group(1, rollouts, LogprobsOut(rollouts.logprobs, 0), None, rewards)


def ratio_mean(moe_dir: Path, replay: bool, groups: list[Group]) -> float:
    torch.manual_seed(0)
    model, codec = load_model(str(moe_dir))
    cfg = config_from_dict({"algorithm": {"router_replay": {"enabled": replay}}})
    return Learner(model, cfg, codec.pad_id).step(groups).metrics["ratio_mean"]


def test_the_trainer_routes_by_the_groups_record(moe_dir: Path) -> None:
    recorded = group(moe_dir)
    r = recorded.rollouts
    assert r.routes is not None and r.prompt_routes is not None
    # Every token through experts 2 and 3 alone: not what the router chose.
    forced = replace(
        recorded,
        rollouts=replace(
            r,
            routes=np.broadcast_to(np.array([2, 3], np.uint8), r.routes.shape).copy(),
            prompt_routes=np.broadcast_to(np.array([2, 3], np.uint8), r.prompt_routes.shape).copy(),
        ),
    )
    assert ratio_mean(moe_dir, False, [recorded]) == pytest.approx(1.0, abs=1e-4)
    assert ratio_mean(moe_dir, True, [recorded]) == pytest.approx(1.0, abs=1e-4)
    assert ratio_mean(moe_dir, False, [forced]) == pytest.approx(1.0, abs=1e-4)  # ignored
    # Replayed: the tokens' ratios scatter (up and down: their mean moves less than each).
    assert abs(ratio_mean(moe_dir, True, [forced]) - 1.0) > 1e-3


def test_logp_scores_by_the_record_in_passes_of_like_length(moe_dir: Path) -> None:
    """Groups of different lengths, scored in several passes (SCORE_SLACK): each pass's
    rows keep their own routes."""
    from asyncrl.actors.policy.sampling import PLAIN
    from asyncrl.actors.training.scorer import _passes_by_length, pack_rollouts, score_rollouts

    model, codec = load_model(str(moe_dir))
    groups = [group(moe_dir).rollouts]
    short = group(moe_dir).rollouts
    keep = 3  # the same group cut short: a pass of its own
    short = replace(
        short,
        response_ids=short.response_ids[:, :keep],
        lengths=np.minimum(short.lengths, keep),
        logprobs=short.logprobs[:, :keep],
        versions=short.versions[:, :keep],
        loss_mask=short.loss_mask[:, :keep],
        routes=short.routes[:, :keep],
    )
    groups.append(short)
    assert len(_passes_by_length(pack_rollouts(groups, codec.pad_id, True))) > 1
    scores = score_rollouts(model, groups, codec.pad_id, PLAIN, replay=True)
    for got, rollouts in zip(scores, groups, strict=True):
        real = rollouts.trained_mask()
        np.testing.assert_allclose(got[real], rollouts.logprobs[real], atol=1e-5)
