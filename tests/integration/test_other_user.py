"""Another user of the machine, played by an unprivileged uid, against a run's listeners
and shared memory: it reads no payload, finds no store, stops no scheduler, and a worker's
key registers only its own role.

The other user runs small scripts with plain pyzmq, as anyone on the machine could; it
is handed what it could not have found (a payload's reference, the scheduler's port), so
that only the keys keep it out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from asyncrl.transport import protocol as p
from asyncrl.transport.dataplane import PayloadServer, PayloadStore
from asyncrl.transport.dataplane.store import default_shared_dir
from asyncrl.transport.identity import payload_secret
from asyncrl.transport.security import payload_keys
from tests.support.cluster import Cluster
from tests.support.runlink import run_link

OTHER_USER = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None,
        reason="plays another user with setpriv, as root",
    ),
    pytest.mark.timeout(60),
]

_FETCH = """
import json, os, sys, zmq
from asyncrl.transport.dataplane.wire import REQUEST
address, store, key = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = {}
for name in os.listdir("/dev/shm"):
    try:
        seen[name] = os.listdir(os.path.join("/dev/shm", name))
    except OSError as error:
        seen[name] = type(error).__name__
# Every store id /dev/shm shows, and the one the reference names.
ids = {store} | {n.rpartition("-")[2] for n in seen} | {n.rpartition("-")[2]
       for names in seen.values() if isinstance(names, list) for n in names}
asker = zmq.Context().socket(zmq.DEALER)
asker.setsockopt(zmq.LINGER, 0)
asker.connect(address)
for store_id in ids:
    asker.send(REQUEST.pack(1, key) + store_id.encode())
answers = []
while asker.poll(2000):
    answers.append(b"".join(asker.recv_multipart()).hex())
print(json.dumps({"seen": seen, "answers": answers}))
"""

_STOP = """
import json, sys, zmq
from asyncrl.transport import protocol as p
asker = zmq.Context().socket(zmq.DEALER)
asker.setsockopt(zmq.LINGER, 0)
asker.connect(sys.argv[1])
asker.send_multipart(p.encode(p.Stop("another user"), 1))
reply = repr(p.decode(asker.recv_multipart())) if asker.poll(3000) else None
print(json.dumps({"reply": reply}))
"""


def as_other_user(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [*OTHER_USER, sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_another_user_neither_fetches_a_payload_nor_finds_its_store() -> None:
    shared = default_shared_dir()
    if shared is None:
        pytest.skip("no /dev/shm")
    keys = payload_keys(payload_secret(os.urandom(32)))
    store = PayloadStore("generate-0", shared_dir=shared)
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=1 << 20, keys=keys)
    try:
        ref = store.put({"text": "the model's secret answer"})
        found = as_other_user(_FETCH, ref.address, ref.store, str(ref.key))
    finally:
        server.close()
        store.close()
    assert found["answers"] == []  # the server never answered a client without the key
    assert ref.store not in json.dumps(found["seen"])  # nor did /dev/shm show the store
    assert found["seen"][shared.name] == "PermissionError"
    info = shared.stat()
    assert info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700


def test_a_shared_memory_directory_made_by_another_user_is_not_used() -> None:
    # A /dev/shm of the test's own, open to all as /dev/shm is (the test's tmp_path is not).
    shm = Path(tempfile.mkdtemp(prefix="asyncrl-test-shm-", dir="/tmp"))
    try:
        shm.chmod(0o1777)
        planted = shm / f"asyncrl-payloads-of-{os.geteuid()}"
        subprocess.run([*OTHER_USER, "mkdir", "-m", "777", str(planted)], check=True)
        assert default_shared_dir(shm) is None
        os.rmdir(planted)
        made = default_shared_dir(shm)
        assert made == planted and planted.stat().st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(shm)


def test_another_user_cannot_stop_a_scheduler_on_loopback_tcp(cluster) -> None:
    c: Cluster = cluster()  # started by hand on 127.0.0.1, no --ipc
    c.scheduler()
    where = c.endpoints()
    assert where["control"].startswith("tcp://127.0.0.1:") and where["curve"] is True
    assert as_other_user(_STOP, where["control"]) == {"reply": None}
    time.sleep(2.5)  # a drained scheduler with no workers would have exited by now
    assert c.procs["scheduler"].poll() is None
    # The owner's tools dial with the keys the run directory holds.
    tool = [sys.executable, "-m", "asyncrl.runtime.scheduler.cli"]
    status = subprocess.run(
        [*tool, "status", "-c", str(c.config_path), "--json"], capture_output=True, check=True
    )
    assert json.loads(status.stdout)["workers"] == {}
    subprocess.run([*tool, "stop", "-c", str(c.config_path)], capture_output=True, check=True)
    assert c.wait("scheduler", 30) == 0


def test_a_generate_workers_key_registers_neither_a_dataloader_nor_a_trainer(cluster) -> None:
    c: Cluster = cluster()
    c.scheduler()
    with run_link(c.run_dir, "generate-0", "generate") as link:
        for role in ("dataloader", "train"):
            reply = link.request(p.Hello("generate-0", role, p.PROTOCOL_VERSION, 1), 5)
            assert isinstance(reply, p.Error) and reply.code == "wrong_key", (role, reply)
        reply = link.request(p.Hello("generate-0", "generate", p.PROTOCOL_VERSION, 1), 5)
        assert isinstance(reply, p.Ready), reply
        assert set(c.status()["workers"]) == {"generate-0"}
    with run_link(c.run_dir, "dataloader-0") as no_key:  # the bus's key, no worker key
        reply = no_key.request(p.Hello("dataloader-0", "dataloader", p.PROTOCOL_VERSION, 1), 5)
        assert isinstance(reply, p.Error) and reply.code == "wrong_key", reply
