"""The queue between the API's thread and the decode loop: results, cancellations, failures."""

from __future__ import annotations

import pytest

from asyncrl.actors.policy.decoder import Finished
from asyncrl.actors.serving.bridge import Bridge, ServeTag


def finished(tag: object) -> Finished:
    return Finished(tag, (1,), [2], [-0.5], [0], False, 2)


def test_a_request_is_taken_once_and_its_future_resolved_by_its_sequence() -> None:
    bridge = Bridge()
    future = bridge.submit([1, 2], 5, frozenset({7}))
    (request,), cancelled = bridge.take()
    assert request.prompt == (1, 2) and request.max_new_tokens == 5
    assert request.stop_ids == {7} and cancelled == []
    assert request.keep_cache  # the session's next call may extend this one
    assert bridge.take() == ([], []) and bridge.busy
    bridge.finish(finished(request.tag))
    assert future.result(0).tokens == [2] and not bridge.busy


def test_a_seed_and_greediness_reach_the_request() -> None:
    bridge = Bridge()
    bridge.submit([1], 3, frozenset(), seed=42)
    bridge.submit([1], 3, frozenset(), greedy=True)
    seeded, greedy = bridge.take()[0]
    assert seeded.seed == 42 and not seeded.greedy
    assert greedy.greedy and greedy.seed is None


def test_a_cancelled_request_leaves_the_decoder_and_a_late_result_is_ignored() -> None:
    bridge = Bridge()
    queued = bridge.submit([1], None, frozenset())
    assert queued.cancel()
    assert bridge.take() == ([], [ServeTag(0)])  # never reaches the decoder
    running = bridge.submit([1], None, frozenset())
    ((request,), _) = bridge.take()
    running.cancel()
    assert bridge.take() == ([], [request.tag])  # the generator cancels it in its decoder
    bridge.finish(finished(request.tag))  # its last token was being decoded: no error
    assert not bridge.busy


def test_a_dropped_decoder_fails_every_request_in_flight() -> None:
    bridge = Bridge()
    futures = [bridge.submit([1], None, frozenset()) for _ in range(2)]
    bridge.take()
    bridge.fail_all("its decode step failed")
    for future in futures:
        with pytest.raises(RuntimeError, match="decode step failed"):
            future.result(0)
    assert not bridge.busy
