"""A version taken as a generator takes it, for tests that publish one."""

from __future__ import annotations

import time

from asyncrl.transport.weights import Received, WeightReceiver, WeightsPlan


def received(receiver: WeightReceiver, plan: WeightsPlan, within_s: float = 60) -> Received:
    """``plan``'s version, whole, from ``receiver``, which is closed after it (its
    tensors are copies: they outlive its buffers). AssertionError naming what came
    instead, or nothing within ``within_s``."""
    try:
        receiver.want(plan)
        deadline = time.monotonic() + within_s
        while (got := receiver.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert isinstance(got, Received), got
        return Received(
            got.version,
            {name: t.clone() for name, t in got.state.items()},
            got.nbytes,
            got.transfer_s,
            got.source,
        )
    finally:
        receiver.close()
