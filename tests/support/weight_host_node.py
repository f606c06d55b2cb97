"""A UCX weight publisher or receiver as a program of its own, to run on a host of
tests/support/hosts.py; the two talk only over the hosts' network, and tell the test
what they do through files in a directory every host shares.

    python -m tests.support.weight_host_node publish DIR   # a new version every PERIOD_S
    python -m tests.support.weight_host_node receive DIR   # fetch the newest, again and again

The publisher writes each announcement as ``DIR/announced-V.msgpack`` (the newest also
as ``DIR/newest``); the receiver fetches the newest version it finds, from the publisher,
as the scheduler's plan would name it, and appends one JSON line per outcome to
``DIR/outcomes.jsonl``: ``{"version", "received": bool, "failed", "t"}``. A fetch that
failed is asked for again at once (with the newest version), as a generator does.
``WEIGHT_NODE_STALL_S`` and ``WEIGHT_NODE_SEND_S`` set the receiver's stall timeout and
the publisher's send timeout (2 s each by default). Both nodes are of a run across machines,
with the same key (:data:`RUN_SECRET`'s): requests and buckets carry its MACs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack

if TYPE_CHECKING:
    from asyncrl.transport.weights import WeightsAccess

PERIOD_S = 0.5
MIB = 2.0  # of each version's state dict
STALL_S = float(os.environ.get("WEIGHT_NODE_STALL_S", "2"))  # the receiver's stall timeout
SEND_S = float(os.environ.get("WEIGHT_NODE_SEND_S", "2"))  # the publisher's send timeout
RUN_SECRET = b"the weight host nodes' run secret"


def across_machines() -> WeightsAccess:
    """Access as a node of a run across machines has it (imported here, as UCX is)."""
    from asyncrl.transport.weights import WeightsAccess, weights_key

    return WeightsAccess(local=False, key=weights_key(RUN_SECRET))


def publish(directory: Path) -> None:
    from asyncrl.transport.weights.ucx import UcxPublisher
    from tests.support.weight_nodes import model_state

    publisher = UcxPublisher(bucket_mb=1, send_timeout_s=SEND_S, access=across_machines())
    version = 0
    while True:
        version += 1
        a = publisher.publish(version, model_state(version, MIB))
        body = msgpack.packb([a.version, a.manifest, a.address])
        path = directory / f"announced-{version}.msgpack"
        path.with_suffix(".tmp").write_bytes(body)
        path.with_suffix(".tmp").rename(path)
        (directory / "newest.tmp").write_text(str(version))
        (directory / "newest.tmp").rename(directory / "newest")
        time.sleep(PERIOD_S)


def receive(directory: Path) -> None:
    from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
    from asyncrl.transport.weights.ucx import UcxReceiver

    receiver = UcxReceiver(bucket_mb=1, stall_timeout_s=STALL_S, access=across_machines())
    outcomes = (directory / "outcomes.jsonl").open("a", buffering=1)
    held = 0
    while True:
        newest = directory / "newest"
        version = int(newest.read_text()) if newest.exists() else 0
        if version <= held:  # a plan for a version held is ignored: wait for a newer one
            time.sleep(0.05)
            continue
        v, manifest, address = msgpack.unpackb(
            (directory / f"announced-{version}.msgpack").read_bytes()
        )
        receiver.want(WeightsPlan(v, manifest, "publisher", address))
        outcome = None
        while outcome is None:
            time.sleep(0.01)
            outcome = receiver.poll()
        if isinstance(outcome, Received):
            receiver.loaded(outcome)
            held = outcome.version
            line = {"version": outcome.version, "received": True, "failed": ""}
        else:
            assert isinstance(outcome, NeedsPlan)
            line = {"version": outcome.version, "received": False, "failed": outcome.failed}
        outcomes.write(json.dumps({**line, "t": time.time()}) + "\n")
        time.sleep(0.1)


if __name__ == "__main__":
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    what, where = sys.argv[1], Path(sys.argv[2])
    {"publish": publish, "receive": receive}[what](where)
