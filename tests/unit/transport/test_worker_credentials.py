"""A worker's credentials: from its launcher's environment (taken out of it at once), else
from the run secret beside it, else a clear stop before it dials anyone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asyncrl.actors.worker.credentials import worker_credentials
from asyncrl.runtime.contract.commands import UsageError
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport.identity import (
    PAYLOAD_KEY_ENV,
    WORKER_KEY_ENV,
    connection_identity,
    ensure_run_secret,
    payload_secret,
    worker_env,
    worker_key,
)


def test_a_launched_worker_takes_its_keys_out_of_the_environment(tmp_path, monkeypatch):
    secret = b"s" * 32
    for variable, value in worker_env(secret, "generate-0", "generate").items():
        monkeypatch.setenv(variable, value)
    found = worker_credentials("generate-0", "generate", RunDir(tmp_path))  # no secret there
    assert found.routing_id == connection_identity(
        "generate-0", worker_key(secret, "generate-0", "generate")
    )
    assert found.payload_secret == payload_secret(secret)
    assert WORKER_KEY_ENV not in os.environ and PAYLOAD_KEY_ENV not in os.environ
    assert "<hidden>" in repr(found)


def test_a_worker_beside_its_run_derives_its_keys_from_the_run_secret(tmp_path: Path):
    run = RunDir(tmp_path)
    secret = ensure_run_secret(run.secret)
    found = worker_credentials("train-0", "train", run)
    assert found.routing_id == connection_identity(
        "train-0", worker_key(secret, "train-0", "train")
    )
    assert found.payload_secret == payload_secret(secret)


def test_a_worker_with_no_key_and_no_secret_stops_saying_how_to_start_it(tmp_path: Path):
    with pytest.raises(UsageError, match=r"no worker key.*asyncrl run or asyncrl node"):
        worker_credentials("generate-0", "generate", RunDir(tmp_path))
