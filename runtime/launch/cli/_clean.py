"""``asyncrl clean``: what runs killed with -9 left behind, found and removed.

    asyncrl clean [RUN_DIR ...] [--shm DIR] [--dry-run]

In shared memory (``/dev/shm``, or ``--shm``): payload stores whose process is gone; a
run's weight slot files whose trainer is gone and that no generator maps; a trainer's
or critic's staged state that no process holds (a ``--resume`` of that run then starts
from its newest checkpoint). In each RUN_DIR (and its ``checkpoints/`` and ``critic/``):
the temporary directories of checkpoint writers that were killed. Only this user's,
only this host's processes judged: a process alive (of any user) keeps what is its.
Each thing is printed as it goes, then one summary line; ``--dry-run`` removes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.whole_dirs import leftovers
from asyncrl.transport.dataplane.store import store_owners, user_shared_dir
from asyncrl.transport.host import process_alive
from asyncrl.transport.weights.shm.slot_file import trainer_of

__all__ = ["add_clean_parser"]

_STAGED = ("-trainer", "-critic")  # RunDir.staged_state's and critic_staged_state's ends


@dataclass(frozen=True, slots=True)
class _Found:
    path: Path
    what: str
    held: bool  # a live process's: kept


def _clean(args: argparse.Namespace) -> int:
    found = [*_in_shared_memory(args.shm), *(f for run in args.run_dirs for f in _in_run(run))]
    removed, freed, kept = 0, 0, 0
    verb = "would remove" if args.dry_run else "removed"
    for item in found:
        if item.held:
            kept += 1
            print(f"kept {item.path} ({item.what}, in use)")
            continue
        size = _size(item.path)
        if not args.dry_run and not _remove(item.path):
            kept += 1
            print(f"kept {item.path} ({item.what}, taken up as it was removed)")
            continue
        removed, freed = removed + 1, freed + size
        print(f"{verb} {item.path} ({item.what}, {_amount(size)})", flush=True)
    places = ", ".join(str(p) for p in [args.shm, *args.run_dirs])
    print(f"asyncrl clean: {verb} {removed} left by dead processes ({_amount(freed)}); "
          f"kept {kept} in use; looked in {places}")  # fmt: skip
    return 0


def _in_shared_memory(shm: Path) -> Iterator[_Found]:
    if not shm.is_dir():
        return
    # This user's stores live in their private directory; older versions put them in shm.
    for place in (user_shared_dir(shm), shm):
        for directory, pid in sorted(store_owners(place).items()):
            yield _Found(directory, f"payload store of process {pid}", process_alive(pid))
    for directory in sorted(shm.glob(f"asyncrl-{os.getuid()}-*")):
        if not _mine(directory) or not directory.is_dir():
            continue
        if directory.name.endswith(_STAGED):
            for path in sorted(directory.glob("*.state")):
                yield _Found(path, "staged learner state", _held(path))
            continue
        for path in sorted(directory.rglob("*.weights")):
            pid = trainer_of(path)
            if pid is not None:
                alive = process_alive(pid) or _held(path)  # a generator may map it still
                yield _Found(path, f"weight slot file of trainer {pid}", alive)


def _in_run(root: Path) -> Iterator[_Found]:
    run = RunDir(root)
    for directory in (run.root, run.checkpoints, run.critic_checkpoints):
        if directory.is_dir():
            for leftover in leftovers(directory):
                yield _Found(leftover.path, f"a killed writer's, process {leftover.pid}", False)


def _held(path: Path) -> bool:
    """Whether a process holds ``path`` (an flock), tried without waiting."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False


def _remove(path: Path) -> bool:
    """Remove ``path``; a file only while holding it, so one a process took up in the
    meantime stays (False), and its directory with it once that is empty."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        return True
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)
    for directory in (path.parent, path.parent.parent):  # a critic's slot files: one deeper
        with contextlib.suppress(OSError):
            if directory.name.startswith(f"asyncrl-{os.getuid()}-") or directory.name == "critic":
                directory.rmdir()  # only once empty
    return True


def _mine(path: Path) -> bool:
    return path.lstat().st_uid == os.getuid()


def _size(path: Path) -> int:
    if not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())


def _amount(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size / 1024:.1f} KiB"


def add_clean_parser(commands: argparse._SubParsersAction) -> None:
    clean = commands.add_parser(
        "clean",
        help="remove what runs killed with -9 left in /dev/shm and run directories",
        description=__doc__.split("\n\n")[2].replace("\n", " ").replace("``", ""),
    )
    clean.add_argument("run_dirs", nargs="*", type=Path, metavar="RUN_DIR",
                       help="run directories to clear of killed writers' temporary "
                       "directories")  # fmt: skip
    clean.add_argument("--shm", type=Path, default=Path("/dev/shm"),
                       help="the shared memory to look in (default /dev/shm)")  # fmt: skip
    clean.add_argument("--dry-run", action="store_true",
                       help="list what would be removed, and remove nothing")  # fmt: skip
    clean.set_defaults(handler=_clean)
