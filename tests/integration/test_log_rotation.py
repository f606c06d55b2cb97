"""A supervised process's log stays under its bound: rotated by size, a few files kept,
each private, and what the process writes to stderr follows the newest file."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

from asyncrl.runtime.launch._spawn import spawn
from asyncrl.runtime.launch.last_words import last_words

MAX_BYTES = 16_000
KEEP = 2
LINE_BYTES = 400  # about, as JSON


def test_a_chatty_process_keeps_its_log_under_the_bound(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from asyncrl.runtime.contract.logs import configure_logging, get_logger
        configure_logging(process="chatty", max_bytes={MAX_BYTES}, keep={KEEP})
        log = get_logger("chatty")
        for i in range(2000):  # about 800 kB
            log.warning("refused a client", i=i, detail="x" * 300)
        sys.exit("the last words")
        """
    )
    log_path = tmp_path / "logs" / "chatty.log"
    log_path.parent.mkdir()
    old_umask = os.umask(0o022)  # a permissive umask: the logs are private anyway
    try:
        child = spawn([sys.executable, "-c", script], log_path, None)
        assert child.wait(timeout=120) == 1
    finally:
        os.umask(old_umask)
    files = sorted(log_path.parent.iterdir())
    assert [f.name for f in files] == ["chatty.log", "chatty.log.1", "chatty.log.2"]
    for file in files:
        assert file.stat().st_size <= MAX_BYTES + LINE_BYTES, file
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    newest = log_path.read_text()
    assert '"i": 1999' in newest
    # The exit message went to stderr, which followed the rotations.
    assert last_words(log_path, since=10 * MAX_BYTES) == "the last words"
