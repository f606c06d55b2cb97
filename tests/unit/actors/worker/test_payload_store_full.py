"""A full /dev/shm: a payload that does not fit is a clear error that fails its lease,
never a SIGBUS in the middle of writing it. Each test mounts a 256 KiB tmpfs of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import structlog

from asyncrl.actors.actor import Outcome
from asyncrl.actors.worker.data_plane import WorkerPayloads
from asyncrl.actors.worker.leases import Leases
from asyncrl.actors.worker.time_split import TimeSplit
from asyncrl.transport import protocol as p
from asyncrl.transport.dataplane import PayloadStore
from asyncrl.transport.security import payload_keys

MIB = 1 << 20


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_payload_larger_than_the_tmpfs_is_a_clear_error_not_sigbus(small_tmpfs: Path) -> None:
    # In a process of its own: on a store that writes unreserved pages, SIGBUS kills it.
    script = textwrap.dedent(
        f"""
        import numpy as np
        from pathlib import Path
        from asyncrl.transport.dataplane import PayloadStore, StoreFull
        store = PayloadStore("generate-0", shared_dir=Path({str(small_tmpfs)!r}))
        kept = store.put({{"tokens": np.zeros(16, np.int32)}})  # a small one fits
        try:
            store.put({{"tokens": np.zeros({MIB // 4}, np.int32)}})
        except StoreFull as full:
            print("full:", full)
        assert store.get(kept.key) is not None
        assert store.keys() == {{kept.key}}, store.keys()
        store.close()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr.decode()[-2000:])
    said = done.stdout.decode()
    assert f"{MIB + 16:,}" in said or "bytes does not fit in" in said, said
    assert str(small_tmpfs) in said and "bytes free" in said


def test_results_that_do_not_fit_fail_their_lease_with_the_reason(small_tmpfs: Path) -> None:
    sent: list[p.Message] = []

    def call(message: p.Message) -> p.Message:
        sent.append(message)
        return p.Ack()

    payloads = WorkerPayloads(
        "generate-0",
        host="127.0.0.1",
        inline_bytes=1024,
        fetch_timeout_s=1.0,
        max_message_bytes=64 * MIB,
        shared_memory=False,
        keys=payload_keys(b"k" * 32),
    )
    payloads.store = PayloadStore("generate-0", shared_dir=small_tmpfs)
    leases = Leases(
        "generate-0",
        payloads,
        call,
        TimeSplit(),
        structlog.get_logger("test"),
        results_are_read=True,
    )
    lease = p.Lease(7, 70, "generate", 30.0, 0, (p.Item(1, "a", {}), p.Item(2, "b", {})))
    fits = p.Result(1, {"tokens": np.zeros(1024, np.int32)})  # 4 KiB: kept
    too_big = p.Result(2, {"tokens": np.zeros(MIB // 4, np.int32)})
    try:
        assert leases.finish(lease, Outcome((fits, too_big))) is None
        (fail,) = sent
        assert isinstance(fail, p.Fail) and fail.lease_id == 7 and fail.gids is None
        assert "does not fit in" in fail.reason and str(small_tmpfs) in fail.reason
        assert payloads.store.keys() == set()  # the one that fitted is freed again
    finally:
        payloads.close()
