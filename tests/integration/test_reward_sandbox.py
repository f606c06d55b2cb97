"""Rewards that read model output run in a child process killed at the time limit
(actors/tasks/sandbox.py): a response that makes the verifier compute for ever in one
call holding the GIL fails its group in time, and the worker's threads (its heartbeats)
run meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from asyncrl.actors.tasks import RewardFunction, Sample, TaskError
from asyncrl.actors.tasks.rewards import load_reward
from asyncrl.actors.workload import load_workload, reward_for, validation_reward_for
from asyncrl.runtime.contract.config import config_from_dict

pytest.importorskip("math_verify")

# The whole story in a fresh interpreter, so that old code, whose call never returns
# (the GIL held by one C call), fails the test on its time limit instead of hanging it.
_FROZEN_VERIFIER = r"""
import json, sys, threading, time
from asyncrl.actors.tasks import Sample, TaskError
from asyncrl.actors.worker.heartbeats import Heartbeats
from asyncrl.actors.workload import reward_for
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.transport import protocol as p

cfg = config_from_dict({"data": {"reward": "math", "reward_timeout_s": 1.0}})
reward = reward_for(cfg)
sample = Sample("What is 2+2?", "4")
assert reward.score_all(sample, ["\\boxed{4}"]) == [1.0]  # its process started

beats = []

class NothingKept:
    def held(self, worker):
        return None

def request(message, timeout_s):
    beats.append(time.monotonic())
    return p.Ack()

heartbeats = Heartbeats(
    "reward-0", request, NothingKept(), request_timeout_s=1.0, interval=lambda: 0.05,
    holding=lambda: (), log=None,
)
heartbeats.start()
started = time.monotonic()
try:
    reward.score_all(sample, ["so \\boxed{9^{9^{9^{9}}}}"])
    error = None
except TaskError as caught:
    error = str(caught)
ended = time.monotonic()
heartbeats.stop(1.0)
after = reward.score_all(sample, ["\\boxed{4}", "\\boxed{5}"])
during = sum(started <= beat <= ended for beat in beats)
print(json.dumps({"error": error, "took_s": ended - started, "beats": during,
                  "killed": reward.killed, "after": after}))
"""


def test_the_tower_of_powers_fails_its_call_in_time_and_the_heartbeats_go_on() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FROZEN_VERIFIER], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["error"] == (
        "reward 'math' did not return: still running after 1 s; its process was killed"
    )
    assert out["took_s"] < 1.0 + 10.0  # the limit, and a kill on a busy machine
    assert out["beats"] >= 5  # 20 a second: the worker's threads ran through the call
    assert out["killed"] == 1
    assert out["after"] == [1.0, 0.0]  # the next call, in a fresh process


def test_a_run_scores_its_training_and_validation_rewards_out_of_process() -> None:
    cfg = config_from_dict({})  # the embedded default: the arithmetic task's own reward
    task = load_workload(cfg)
    for reward in (reward_for(cfg), validation_reward_for(cfg, task)):
        assert reward.sandbox is not None
        sample = task.sample("validation", 0)
        assert reward(sample, task.reference(sample)) == 1.0
        reward.close()
    # With a judge, validation scores with the task's own reward: out of process too.
    judged = config_from_dict({"data": {"reward": "judge:tests.support.judges:agrees_with_greedy"}})
    assert validation_reward_for(judged, task).sandbox is not None


def test_a_plug_in_fails_out_of_process_as_it_would_in_process() -> None:
    sample = Sample("1+2=", "3")
    raising = RewardFunction.load("tests.support.tasks:raising_reward", None, "t", timeout_s=30)
    with pytest.raises(TaskError, match=r"reward '.*raising_reward' raised KeyError"):
        raising(sample, "3")
    words = RewardFunction.load("tests.support.sandboxed_rewards:words", None, "t", timeout_s=30)
    with pytest.raises(TaskError, match="returned str, not a number"):
        words(sample, "3")
    exits = RewardFunction.load("tests.support.sandboxed_rewards:exits", None, "t", timeout_s=30)
    with pytest.raises(TaskError, match="its process exited with code 3"):
        exits(sample, "exit")
    assert exits(sample, "fine") == 1.0  # a fresh process
    assert exits.killed == 0  # it ended by itself: no call ran out of time
    for reward in (raising, words, exits):
        reward.close()


def test_a_batch_reward_gets_the_group_and_the_samples_extras() -> None:
    reward = RewardFunction.load("tests.support.sandboxed_rewards:batched", None, "t", timeout_s=30)
    extras = {"bonus": np.float64(0.5), "ids": np.arange(3)}
    sample = Sample("q", "a", "src", extras, ({"role": "user", "content": "q"},))
    assert reward.score_all(sample, ["ab", "abcd"]) == [2.5, 4.5]
    reward.close()


def test_the_process_outlives_a_failed_call() -> None:
    reward = load_reward("math", None, "t", timeout_s=30)
    with pytest.raises(TaskError, match=r"reward 'math' raised TaskError: ground truth '\}\{'"):
        reward(Sample("q", "}{"), "1")
    started = time.monotonic()
    assert reward(Sample("q", "1/2"), "0.5") == 1.0
    assert time.monotonic() - started < 5.0  # the same process: no second start
    reward.close()


def test_a_process_that_ended_between_calls_is_replaced_without_failing_a_call() -> None:
    reward = load_reward("math", None, "t", timeout_s=30)
    assert reward(Sample("q", "2"), "\\boxed{2}") == 1.0
    assert reward.sandbox is not None and reward.sandbox.pid is not None
    first = reward.sandbox.pid
    os.kill(first, signal.SIGKILL)  # as the thread that started it ending would
    wait_until(lambda: not alive(first))
    assert reward(Sample("q", "2"), "\\boxed{3}") == 0.0
    assert reward.sandbox.pid != first
    reward.close()


def alive(pid: int) -> bool:
    """Running, as /proc has it: a zombie (killed, not yet reaped) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)
