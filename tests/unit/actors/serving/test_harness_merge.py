"""A session's calls → sequences: extending calls merge, others start a new sequence."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from asyncrl.actors.payloads import RolloutsOut
from asyncrl.actors.serving.call_records import (
    CallRecord,
    SessionRecords,
    decode_records,
    encode_records,
)
from asyncrl.actors.serving.merge import merge_calls


def call(prompt: list[int], completion: list[int], version: int = 1) -> CallRecord:
    logprobs = [-0.1 * (i + 1) for i in range(len(completion))]
    return CallRecord(prompt, completion, logprobs, [version] * len(completion), False)


def test_a_call_that_extends_the_last_one_continues_its_sequence() -> None:
    first = call([1, 2, 3], [4, 5], version=1)
    second = call([1, 2, 3, 4, 5, 9, 9], [6, 7], version=2)  # 9 9: a tool's output
    (seq,) = merge_calls([first, second], owner=3)
    assert list(seq.tokens) == [1, 2, 3, 4, 5, 9, 9, 6, 7]
    assert list(seq.trained) == [False] * 3 + [True] * 2 + [False] * 2 + [True] * 2
    assert list(seq.versions) == [0, 0, 0, 1, 1, 0, 0, 2, 2]
    assert list(seq.logprobs) == [0, 0, 0, -0.1, -0.2, 0, 0, -0.1, -0.2]
    assert seq.owner == 3


def test_a_call_whose_prompt_rewrites_the_history_starts_another_sequence() -> None:
    calls = [
        call([1, 2], [3]),
        call([1, 2, 3, 8], [4]),  # extends the first
        call([1, 2, 7], [5]),  # rewrites: the 3 sampled is not in its prompt
        call([1, 2, 7, 5], [6]),  # extends the third
        call([1], [2]),  # a shorter prompt never extends
    ]
    seqs = merge_calls(calls, owner=0)
    assert [list(s.tokens) for s in seqs] == [[1, 2, 3, 8, 4], [1, 2, 7, 5, 6], [1, 2]]
    assert [list(s.trained) for s in seqs] == [
        [False, False, True, False, True],
        [False, False, False, True, True],
        [False, True],
    ]
    assert {s.owner for s in seqs} == {0}


def test_an_identical_prompt_again_extends_nothing_new_but_the_completion() -> None:
    # The same prompt + completion sent back with nothing in between extends exactly.
    seqs = merge_calls([call([1, 2], [3]), call([1, 2, 3], [4])], owner=0)
    assert [list(s.tokens) for s in seqs] == [[1, 2, 3, 4]]
    assert list(seqs[0].trained) == [False, False, True, True]


def test_the_choices_of_one_call_each_train_as_a_sequence_of_their_own() -> None:
    # A call with n = 3 is recorded as three calls of one prompt, in choice order.
    choices = [call([1, 2], [3, 4]), call([1, 2], [5]), call([1, 2], [3, 6])]
    seqs = merge_calls(choices, owner=1)
    assert [list(s.tokens) for s in seqs] == [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6]]
    assert [sum(s.trained) for s in seqs] == [2, 1, 2]


def test_a_group_of_sessions_makes_one_rollouts_payload_with_owners_and_rewards() -> None:
    seqs = [
        *merge_calls([call([1, 2], [3, 4]), call([1, 2, 3, 4, 5], [6])], owner=0),
        *merge_calls([call([1, 2], [7]), call([1, 9], [8])], owner=1),
    ]
    out = RolloutsOut.from_sequences(seqs, rewards=[1.0, 0.0])
    assert out.prompt_ids.tolist() == [1]
    assert out.owners.tolist() == [0, 1, 1]
    assert out.rewards is not None and out.rewards.tolist() == [1.0, 0.0]
    assert out.responses()[0] == [2, 3, 4, 5, 6]
    assert out.loss_mask[0, : out.lengths[0]].tolist() == [0, 1, 1, 0, 1]
    assert out.behaviour() == (1, 1)
    assert np.all(out.logprobs[~out.trained_mask()] == 0)


def test_session_records_are_taken_once_and_dropped_when_nobody_collects_them() -> None:
    now = [0.0]
    records = SessionRecords(ttl_s=10, clock=lambda: now[0])
    records.add("a", call([1], [2]))
    records.add("a", call([1, 2], [3]))
    assert [c.completion_ids for c in records.take("a")] == [[2], [3]]
    assert records.take("a") == []
    records.add("b", call([1], [2]))
    now[0] = 11.0
    records.add("c", call([1], [2]))  # any call sweeps what is past its time
    assert records.take("b") == [] and records.dropped == 1
    assert len(records) == 1


def test_records_torn_on_their_way_are_a_decode_error_not_a_crash() -> None:
    good = encode_records([CallRecord([1], [2], [-0.5], [0], False)])
    assert decode_records(good) == [CallRecord([1], [2], [-0.5], [0], False)]
    torn = good.replace(b"prompt_ids", b"prompt_i\xb4s")  # a field name that is not UTF-8
    with pytest.raises(msgspec.DecodeError, match="missing required field"):
        decode_records(torn)
