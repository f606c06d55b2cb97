"""trace.json: what the service's calls write, read back, across a crash and a resume."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.runtime.scheduler.core.effects import Grant
from asyncrl.runtime.scheduler.service.trace import TraceLog, read_trace

REQUIRED = {"ph", "ts", "pid", "tid", "name"}


def _grant(lid: int, role: str, version: int | None = None) -> Grant:
    return Grant(lid, fence=7, role=role, expires_at=100.0, groups=(1, 2), version=version)


def _trace(path: Path) -> TraceLog:
    return TraceLog(path, now=10.0, wall_offset_s=1000.0)


def test_a_lease_becomes_one_complete_event_when_it_leaves_the_core(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "trace.json")
    trace.granted(_grant(1, "generate", 3), "generate-0", 10.0)
    trace.settled(1, "complete", {1}, 10.5)  # part of the lease: still open
    trace.granted(_grant(2, "train", 3), "train-0", 10.2)
    trace.settled(2, "complete", set(), 10.6)
    trace.step(4, "train-0", 10.6)
    trace.published("train-0", 4, 10.7)
    trace.loaded("generate-0", 4, 10.8)
    trace.weights_report(
        "generate-0", 4, {"transfer_s": 0.05, "load_s": 0.05, "stall_s": 0.01}, 10.9
    )
    trace.sweep(set(), 11.0)  # the clock ended lease 1
    trace.close()
    events = read_trace(tmp_path / "trace.json")
    for e in events:
        assert e.keys() >= REQUIRED, e
        if e["ph"] == "X":
            assert e["dur"] >= 0
    leases = {e["args"]["lease"]: e for e in events if e.get("cat") == "lease"}
    assert leases[2]["ts"] == 1010.2e6 and leases[2]["dur"] == 0.4e6
    assert leases[2]["args"] == {"lease": 2, "groups": 2, "outcome": "complete", "version": 3}
    assert leases[1]["dur"] == 1e6 and leases[1]["args"]["outcome"] == "expired or worker lost"
    weights = next(e for e in events if e["name"] == "weights v4")
    assert weights["ts"] == round(1010.8e6) and weights["ph"] == "X"
    rows = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert rows == {"generate-0", "train-0"}
    step = next(e for e in events if e["name"] == "step 4")
    assert step["ph"] == "i" and step["s"] == "g"


def test_the_file_is_a_json_array_but_for_its_closing_bracket(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    trace = _trace(path)
    trace.granted(_grant(1, "logp"), "logp-0", 10.0)
    trace.settled(1, "fail", set(), 10.1)
    trace.close()
    assert json.loads(path.read_text() + "]") == read_trace(path)


def test_a_resumed_scheduler_cuts_a_torn_line_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    trace = _trace(path)
    trace.step(1, "train-0", 10.0)
    trace.close()
    before = read_trace(path)
    with open(path, "a") as f:
        f.write(',{"name":"step 2","ph":"i"')  # the crash tore this one
    assert read_trace(path) == before  # a reader skips it
    again = _trace(path)
    again.step(2, "train-0", 20.0)
    again.close()
    steps = [e["args"]["step"] for e in read_trace(path) if e["ph"] == "i"]
    assert steps == [1, 2]
    json.loads(path.read_text() + "]")


def test_a_resumed_scheduler_keeps_every_worker_on_its_row(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    first = _trace(path)
    first.loaded("logp-0", 1, 10.0)
    first.loaded("generate-0", 1, 10.0)
    first.close()
    again = _trace(path)
    again.loaded("generate-0", 2, 20.0)  # seen first this time: must keep pid 2, tid 2
    again.loaded("train-0", 2, 20.0)
    again.close()
    events = read_trace(path)
    rows = {e["args"]["name"]: (e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert rows == {"logp-0": (1, 1), "generate-0": (2, 2), "train-0": (3, 3)}
    assert sum(e["name"] == "thread_name" for e in events) == 3
    assert sum(e["name"] == "process_name" for e in events) == 4  # scheduler and 3 roles


def test_a_closed_array_is_reopened(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text('[\n{"name":"x","ph":"i","ts":1,"pid":0,"tid":0}\n]\n')
    trace = _trace(path)
    trace.step(1, "train-0", 10.0)
    trace.close()
    names = [e["name"] for e in json.loads(path.read_text() + "]")]
    assert names == ["x", "step 1"]
