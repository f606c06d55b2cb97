"""Router replay's record in the generate payload: it survives the wire, keeps a shared
prompt once, and says clearly what is wrong with it."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.actors.payloads import PayloadError, RolloutsOut, Sampled
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

LAYERS, PER_TOKEN = 3, 2


def over_the_wire(rollouts: RolloutsOut, key: str = "g1") -> p.Item:
    item = p.Item(1, key, {Role.GENERATE.value: rollouts.to_payload()})
    lease = p.Lease(1, 1, "logp", 5.0, 0, (item,))
    decoded = p.decode(p.encode(lease))
    assert isinstance(decoded, p.Lease)
    return decoded.items[0]


def routes(tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 8, (tokens, LAYERS, PER_TOKEN), np.uint8)


def sequence(prompt: list[int], response: list[int], record: np.ndarray | None) -> Sampled:
    tokens = [*prompt, *response]
    trained = [False] * len(prompt) + [True] * len(response)
    return Sampled(tokens, [0.0] * len(tokens), [1] * len(tokens), trained, routes=record)


def test_routes_round_trip_with_a_shared_prompt_kept_once() -> None:
    prompt = routes(3, 0)
    # Every token the model read: the prompt, and the response but its last token.
    first = np.concatenate([prompt, routes(2, 1)])
    second = np.concatenate([prompt, routes(4, 2)])
    rollouts = RolloutsOut.from_sequences(
        [sequence([5, 6, 7], [3, 4, 1], first), sequence([5, 6, 7], [9, 9, 9, 9, 1], second)]
    )
    assert rollouts.prompt_routes is not None and rollouts.prompt_routes.shape == (3, 3, 2)
    back = RolloutsOut.of(over_the_wire(rollouts), routes=True)
    assert back.routes is not None and back.routes.shape == (2, 5, LAYERS, PER_TOKEN)
    rows = back.row_routes()
    # Each row: its prompt's and response's tokens; the response's last token reads as 0.
    assert [len(r) for r in rows] == [6, 8]
    np.testing.assert_array_equal(rows[0][:5], first)
    np.testing.assert_array_equal(rows[1][:7], second)
    assert not rows[0][5:].any() and not rows[1][7:].any()
    # The bound: layers x per_token bytes a token, the shared prompt once.
    assert back.route_bytes() == (3 + 2 * 5) * LAYERS * PER_TOKEN


def test_prompts_routed_apart_are_kept_per_row() -> None:
    first, second = routes(4, 3), routes(4, 4)
    rollouts = RolloutsOut.from_sequences(
        [sequence([5, 6], [3, 1, 2], first), sequence([5, 6], [4, 1, 2], second)]
    )
    assert rollouts.prompt_routes is not None and rollouts.prompt_routes.shape == (2, 2, 3, 2)
    back = RolloutsOut.of(over_the_wire(rollouts), routes=True)
    np.testing.assert_array_equal(back.row_routes()[1][:4], second)


def test_a_group_without_routes_is_fine_unless_replay_needs_them() -> None:
    plain = RolloutsOut.stack([5, 6], [([3, 1], [-0.5, -0.1], [1, 1], False)])
    item = over_the_wire(plain, "train-000000042")
    assert RolloutsOut.of(item).routes is None
    with pytest.raises(PayloadError, match=r"'train-000000042' has no generate\.routes"):
        RolloutsOut.of(item, routes=True)
    # A group with one sequence recorded and one not carries none.
    mixed = RolloutsOut.from_sequences(
        [sequence([5], [3, 1], routes(2, 5)), sequence([5], [4, 1], None)]
    )
    assert mixed.routes is None and mixed.prompt_routes is None


def test_bad_route_shapes_are_named() -> None:
    with pytest.raises(ValueError, match=r"sequence 0: routes for 7 tokens; expected 1\.\.3"):
        RolloutsOut.from_sequences([sequence([5], [3, 1], routes(7, 6))])
    rollouts = RolloutsOut.from_sequences([sequence([5, 6], [3, 1], routes(3, 7))])
    payload = rollouts.to_payload()
    payload["routes"] = payload["routes"][:, :1]  # one column short
    item = p.Item(1, "k9", {Role.GENERATE.value: payload})
    with pytest.raises(PayloadError, match=r"'k9': generate\.routes is \[1, 1, 3, 2\]; expected"):
        RolloutsOut.of(item)
    payload = rollouts.to_payload()
    payload["prompt_routes"] = payload["prompt_routes"][:1]
    item = p.Item(1, "k9", {Role.GENERATE.value: payload})
    with pytest.raises(PayloadError, match=r"generate\.prompt_routes is uint8 \[1, 3, 2\]"):
        RolloutsOut.of(item)
    payload = rollouts.to_payload()
    payload["routes"] = payload["routes"].astype(np.float32)
    item = p.Item(1, "k9", {Role.GENERATE.value: payload})
    with pytest.raises(PayloadError, match=r"generate\.routes is not a uint8/int16 array"):
        RolloutsOut.of(item)


def test_a_micro_batchs_rows_keep_their_routes() -> None:
    from asyncrl.actors.training.group import Group

    prompt = routes(2, 8)
    records = [np.concatenate([prompt, routes(n, 9 + n)]) for n in (1, 4, 2)]
    rollouts = RolloutsOut.from_sequences(
        [sequence([5, 6], [3] * n + [1], r) for n, r in zip((1, 4, 2), records, strict=True)]
    )
    group = Group(1, rollouts, None, None, np.zeros(3, np.float32))
    part = group.rows(np.array([0, 2])).rollouts
    assert part.routes is not None and part.routes.shape == (2, 3, LAYERS, PER_TOKEN)
    for got, record in zip(part.row_routes(), (records[0], records[2]), strict=True):
        np.testing.assert_array_equal(got[: len(record)], record)
