"""Multi-turn trajectories: the loss mask keeps observation and tool tokens out of every
log-prob, loss and gradient, and a trajectory's sequences share its advantage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.actors.payloads import RolloutsOut, Sampled
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.sampling import PLAIN
from asyncrl.actors.policy.scoring import response_logprobs
from asyncrl.actors.rl import LossConfig, policy_loss
from asyncrl.actors.training.scorer import pack_rollouts, score_rollouts
from asyncrl.transport import protocol as p


def sequence(prompt, turns, *, owner=0, truncated=False) -> Sampled:
    """``turns``: (tokens, trained, version) parts after ``prompt``."""
    tokens, logprobs, versions = list(prompt), [0.0] * len(prompt), [0] * len(prompt)
    trained = [False] * len(prompt)
    for part, is_model, version in turns:
        tokens += part
        logprobs += [-0.5 if is_model else 0.0] * len(part)
        versions += [version if is_model else 0] * len(part)
        trained += [is_model] * len(part)
    return Sampled(tokens, logprobs, versions, trained, truncated, owner)


PROMPT = [4, 5, 6]
# Model turn, tool output, model turn: versions 3 then 5 (a weight update between turns).
TWO_TURNS = sequence(PROMPT, [([7, 8], True, 3), ([9, 10, 11], False, 0), ([12, 1], True, 5)])
ONE_TURN = sequence(PROMPT, [([13, 1], True, 4)], owner=1)


def over_the_wire(out: RolloutsOut) -> RolloutsOut:
    lease = p.Lease(1, 1, "train", 5.0, 0, (p.Item(3, "k", {"generate": out.to_payload()}),))
    decoded = p.decode(p.encode(lease))
    assert isinstance(decoded, p.Lease)
    return RolloutsOut.of(decoded.items[0])


def test_sequences_keep_their_shared_prompt_mask_versions_and_owners() -> None:
    out = over_the_wire(RolloutsOut.from_sequences([TWO_TURNS, ONE_TURN], rewards=[1.0, 0.0]))
    assert out.prompt_ids.tolist() == PROMPT
    assert out.responses() == [[7, 8, 9, 10, 11, 12, 1], [13, 1]]
    assert out.loss_mask[0].tolist() == [1, 1, 0, 0, 0, 1, 1]
    assert out.trained_tokens() == 6
    assert out.owners.tolist() == [0, 1]
    assert out.rewards is not None and out.rewards.tolist() == [1.0, 0.0]
    # Staleness counts the oldest token the model sampled; tool tokens carry no version.
    assert out.behaviour() == (3, 5)


def test_single_turn_payloads_without_a_mask_read_as_every_token_trained() -> None:
    out = RolloutsOut.stack(
        [4, 5], [([6, 1], [-0.1, -0.2], [2, 2], False), ([7], [-1.0], [2], True)]
    )
    payload = out.to_payload()
    del payload["loss_mask"], payload["owners"]
    item = p.Item(1, "k", {"generate": payload})
    back = RolloutsOut.of(item)
    assert back.trained_mask().tolist() == [[True, True], [True, False]]
    assert back.owners.tolist() == [0, 1] and back.rewards is None


def test_a_group_whose_sequences_share_no_first_token_is_refused() -> None:
    other = sequence([99, 5], [([7], True, 1)])
    with pytest.raises(ValueError, match="share no first token"):
        RolloutsOut.from_sequences([TWO_TURNS, other])
    with pytest.raises(ValueError, match="no token the model sampled"):
        RolloutsOut.from_sequences([sequence(PROMPT, [([9], False, 0)])])


def test_logp_scores_are_exactly_zero_on_tool_tokens() -> None:
    model, codec = load_model("embedded")
    out = RolloutsOut.from_sequences([TWO_TURNS, ONE_TURN])
    (scores,) = score_rollouts(model, [out], codec.pad_id, PLAIN)
    trained = out.trained_mask()
    assert (scores[~trained] == 0).all()
    assert (scores[trained] < 0).all()


def test_tool_tokens_get_exactly_zero_gradient_and_cannot_move_the_loss() -> None:
    """logp's, ref_logp's and the behaviour log-probs at tool positions may be anything
    (even inf): the loss and every parameter's gradient are bit for bit the same."""
    torch.manual_seed(0)
    model, codec = load_model("embedded")
    out = RolloutsOut.from_sequences([TWO_TURNS, ONE_TURN])
    packed = pack_rollouts([out], codec.pad_id)
    cfg = LossConfig(kl_coef=0.1)
    tool = torch.from_numpy(~out.trained_mask())
    behaviour = torch.from_numpy(out.logprobs.copy())

    def loss_and_grads(junk: float):
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, packed)
        logp.retain_grad()
        proximal = (behaviour - 0.05).masked_fill(tool, junk)
        reference = (behaviour - 0.1).masked_fill(tool, junk)
        loss, _ = policy_loss(
            logp,
            proximal,
            behaviour.masked_fill(tool, junk),
            torch.tensor([1.0, -1.0]),
            packed.mask,
            cfg,
            ref_logp=reference,
            total_tokens=out.trained_tokens(),
            total_sequences=2,
            max_len=80,
        )
        loss.backward()
        grads = [param.grad.clone() for param in model.parameters()]
        return loss.detach(), logp.grad.clone(), grads

    loss, logp_grad, grads = loss_and_grads(0.0)
    assert (logp_grad[tool] == 0).all()
    assert (logp_grad[~tool] != 0).any()
    for junk in (-3.0, float("inf")):
        again, _, grads_again = loss_and_grads(junk)
        assert torch.equal(loss, again)
        assert all(torch.equal(a, b) for a, b in zip(grads, grads_again, strict=True))


def test_mask_and_owners_survive_packing_several_groups() -> None:
    a = RolloutsOut.from_sequences([TWO_TURNS, ONE_TURN])
    b = RolloutsOut.stack([4, 5], [([6, 1], [-0.1, -0.2], [2, 2], False)])
    packed = pack_rollouts([a, b], pad_id=0)
    assert packed.mask.tolist() == [
        [1, 1, 0, 0, 0, 1, 1],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
    ]
    assert np.array_equal(packed.starts.numpy(), [3, 3, 2])
