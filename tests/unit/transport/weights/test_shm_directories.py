"""The run's directories in /dev/shm (weight slot files, a trainer's staged state) are its
user's alone: made 0700 whatever the umask, parents included, and one another user made
first (the names are predictable) or left open is refused, as is a slot file of theirs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from asyncrl.actors.training.staged_state import StagedState
from asyncrl.transport.weights.shm.slot_file import Gone, MapCache, MappedVersion, SlotFile
from asyncrl.transport.weights.shm.staging_files import StagingFiles
from tests.support.umask import umask

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_weight_directories_are_made_private_parents_included(tmp_path: Path) -> None:
    policy = tmp_path / "asyncrl-0-abc"
    with umask(0o022):
        files = StagingFiles(policy / "critic")  # the critic's, inside the policy's
    try:
        assert mode(policy) == 0o700 and mode(policy / "critic") == 0o700
    finally:
        files.close()


@pytest.mark.parametrize("how", ["another-users", "open", "a-link"])
def test_a_weights_directory_not_this_users_alone_is_refused(tmp_path: Path, how: str) -> None:
    directory = tmp_path / "asyncrl-0-abc"
    if how == "a-link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        directory.symlink_to(tmp_path / "elsewhere")
    else:
        directory.mkdir(mode=0o700)
        if how == "open":
            directory.chmod(0o755)
        else:
            os.chown(directory, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match="holds weight slot files but is not this user"):
        StagingFiles(directory)


def test_a_trainers_staged_state_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "asyncrl-0-abc-trainer"
    directory.mkdir(mode=0o700)
    os.chown(directory, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match=f"owner {NOBODY}"):
        StagedState(directory, rank=0, identity={})


def test_a_slot_file_of_another_user_is_never_mapped(tmp_path: Path) -> None:
    (tmp_path / "slots").mkdir(mode=0o700)
    slot = SlotFile(tmp_path / "slots" / "1-0.weights", 64)
    slot.begin(64)
    slot.finish(3, 64)
    os.chown(slot.path, NOBODY, NOBODY)
    with pytest.raises(Gone, match="not this user's alone"):
        MappedVersion(slot.path, 3, 64, MapCache())
    os.chown(slot.path, os.getuid(), os.getgid())
    MappedVersion(slot.path, 3, 64, MapCache()).release()
    slot.remove()
