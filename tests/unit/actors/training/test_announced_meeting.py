"""A group split over machines meets where its leader announces in the run directory
(runtime/contract/gangs.py, actors/training/dist_store.py), here on real sockets in one
process: the leader listens on a port the system gives and says so; a follower finds it,
past an announcement of a leader that is gone, and says which address it tried when none
answers."""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from asyncrl.actors.training.dist_store import join_store
from asyncrl.runtime.contract.gangs import (
    ENV_ADDR,
    ENV_RANK,
    ENV_SIZE,
    GangPlace,
    announce_leader,
    announced_leader,
)
from asyncrl.runtime.contract.rundir import RunDir, UntrustedFile
from asyncrl.transport.group_store import GroupStoreServer, StoreGone, StoreRefused

pytestmark = pytest.mark.timeout(60)

SECRET = secrets.token_bytes(32)


def _meeting(tmp_path: Path) -> Path:
    return RunDir(tmp_path).group_leader("train")


def test_a_place_without_an_address_meets_where_its_leader_announces() -> None:
    follower = GangPlace.from_env({ENV_RANK: "1", ENV_SIZE: "2"})
    assert follower == GangPlace(1, 2, "", 0) and follower.announced
    leader = GangPlace.from_env({ENV_RANK: "0", ENV_SIZE: "2", ENV_ADDR: "10.0.0.7:0"})
    assert leader == GangPlace(0, 2, "10.0.0.7", 0) and leader.announced and leader.leads
    given = GangPlace.from_env({ENV_RANK: "1", ENV_SIZE: "2", ENV_ADDR: "10.0.0.7:29400"})
    assert given is not None and not given.announced
    with pytest.raises(ValueError, match="ASYNCRL_GANG_ADDR=:29400"):
        GangPlace.from_env({ENV_RANK: "1", ENV_SIZE: "2", ENV_ADDR: ":29400"})


def test_the_leader_listens_on_the_port_the_system_gives_and_announces_it(
    tmp_path: Path,
) -> None:
    meeting = _meeting(tmp_path)
    assert announced_leader(meeting) is None
    server, store = join_store(GangPlace(0, 2, "127.0.0.1", 0), SECRET, 10.0, meeting=meeting)
    follower = None
    try:
        assert server is not None and server.port > 0
        assert announced_leader(meeting) == ("127.0.0.1", server.port)
        assert meeting.stat().st_mode & 0o777 == 0o600
        _, follower = join_store(GangPlace(1, 2, "", 0), SECRET, 10.0, meeting=meeting)
        store.set("seen", b"by the leader")
        assert follower.get("seen") == b"by the leader"
    finally:
        if follower is not None:
            follower.client.close()
        store.client.close()
        if server is not None:
            server.close()


def test_a_follower_reads_past_a_gone_leaders_announcement_to_the_new_one(
    tmp_path: Path,
) -> None:
    meeting = _meeting(tmp_path)
    gone = GroupStoreServer("127.0.0.1", 0, SECRET)
    gone.close()  # the last start's leader: its port answers no more
    announce_leader(meeting, "127.0.0.1", gone.port)
    servers: list[GroupStoreServer] = []

    def start_again() -> None:
        time.sleep(1.0)
        servers.append(GroupStoreServer("127.0.0.1", 0, SECRET))
        announce_leader(meeting, "127.0.0.1", servers[0].port)

    starting = threading.Thread(target=start_again)
    starting.start()
    try:
        _, store = join_store(GangPlace(1, 2, "", 0), SECRET, 30.0, meeting=meeting)
        starting.join()
        assert store.client.call("num_keys") == 0
        assert announced_leader(meeting) == ("127.0.0.1", servers[0].port)
        store.client.close()
    finally:
        starting.join()
        for server in servers:
            server.close()


def test_no_leader_answering_ends_the_wait_naming_what_was_tried(tmp_path: Path) -> None:
    meeting = _meeting(tmp_path)
    with pytest.raises(StoreGone, match=r"within 1 s \(none announced in .*train.json\)"):
        join_store(GangPlace(1, 2, "", 0), SECRET, 1.0, meeting=meeting)
    gone = GroupStoreServer("127.0.0.1", 0, SECRET)
    gone.close()
    announce_leader(meeting, "127.0.0.1", gone.port)
    with pytest.raises(StoreGone, match=rf"last announced 127.0.0.1:{gone.port} in "):
        join_store(GangPlace(1, 2, "", 0), SECRET, 1.0, meeting=meeting)


def test_a_leader_with_another_secret_is_refused_at_once(tmp_path: Path) -> None:
    meeting = _meeting(tmp_path)
    other = GroupStoreServer("127.0.0.1", 0, secrets.token_bytes(32))
    try:
        announce_leader(meeting, "127.0.0.1", other.port)
        started = time.monotonic()
        with pytest.raises(StoreRefused, match="same run secret"):
            join_store(GangPlace(1, 2, "", 0), SECRET, 30.0, meeting=meeting)
        assert time.monotonic() - started < 10  # not the whole wait
    finally:
        other.close()


def test_an_announcement_others_could_have_written_is_not_followed(tmp_path: Path) -> None:
    meeting = _meeting(tmp_path)
    announce_leader(meeting, "127.0.0.1", 29400)
    os.chmod(meeting, 0o644)
    with pytest.raises(UntrustedFile, match="open to other users"):
        announced_leader(meeting)
    os.chmod(meeting, 0o600)
    meeting.write_text('{"host": "127.0.0.1"}')
    with pytest.raises(UntrustedFile, match="does not read as a leader's address"):
        announced_leader(meeting)
    meeting.write_text('{"host": "", "port": 29400}')
    with pytest.raises(UntrustedFile, match="does not hold a HOST and PORT"):
        announced_leader(meeting)
