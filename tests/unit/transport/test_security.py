"""CurveZMQ key files: private from the first byte, never overwritten, secrets never shown."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import zmq.auth

from asyncrl.transport import security
from asyncrl.transport.security import (
    ClientKeys,
    KeyFileError,
    curve_required,
    ensure_keys,
    keygen,
    load_client_keys,
    load_server_keys,
    payload_keys,
)

pytestmark = pytest.mark.timeout(30)

KEY_FILES = ("server.key", "server.key_secret", "client.key", "client.key_secret")


def test_every_file_is_created_0600_and_the_directory_0700(tmp_path, monkeypatch):
    # With no umask, a file opened with a looser mode would show it; a later chmod is
    # refused outright, so only a mode given at creation can pass.
    old = os.umask(0)
    opened: list[tuple[str, int, int]] = []
    real_open = os.open

    def recording_open(path, flags, mode=0o777, **kwargs):
        opened.append((Path(path).name, flags, mode))
        return real_open(path, flags, mode, **kwargs)

    def no_chmod(*_args, **_kwargs):
        raise AssertionError("keygen must not change a mode after creating a file")

    monkeypatch.setattr(security.os, "open", recording_open)
    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "fchmod", no_chmod)
    try:
        keygen(tmp_path / "keys")
    finally:
        os.umask(old)

    assert sorted(name for name, _, _ in opened) == sorted(KEY_FILES)
    for _name, flags, mode in opened:
        assert mode == 0o600
        assert flags & os.O_CREAT and flags & os.O_EXCL
    for name in KEY_FILES:
        assert stat.S_IMODE((tmp_path / "keys" / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700


def test_keygen_refuses_to_overwrite_any_key(tmp_path):
    keygen(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in KEY_FILES}
    with pytest.raises(FileExistsError, match=r"server\.key"):
        keygen(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in KEY_FILES} == before


def test_keygen_refuses_before_writing_when_one_key_is_left(tmp_path):
    (tmp_path / "client.key_secret").write_text("an old secret\n")
    with pytest.raises(FileExistsError, match=r"client\.key_secret"):
        keygen(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.key_secret"]


def test_loaded_keys_pair_up_and_zmq_can_read_the_files(tmp_path):
    keygen(tmp_path)
    server = load_server_keys(tmp_path)
    client = load_client_keys(tmp_path)
    assert client.server_public == server.public
    assert server.clients == frozenset({client.public})
    assert zmq.curve_public(server.secret) == server.public
    assert zmq.curve_public(client.secret) == client.public
    # The files are ZPL certificates, so ZeroMQ's own tools read them as well.
    assert zmq.auth.load_certificate(tmp_path / "server.key_secret") == (
        server.public,
        server.secret,
    )
    assert zmq.auth.load_certificate(tmp_path / "client.key") == (client.public, None)


def test_repr_and_str_never_show_a_secret(tmp_path):
    keygen(tmp_path)
    for keys in (load_server_keys(tmp_path), load_client_keys(tmp_path)):
        for text in (repr(keys), str(keys), f"{keys}"):
            assert keys.secret.decode() not in text
            assert repr(keys.secret) not in text
            assert keys.public.decode() in text


def test_keys_are_frozen(tmp_path):
    keygen(tmp_path)
    keys = load_client_keys(tmp_path)
    with pytest.raises(AttributeError):
        keys.secret = b"x"  # type: ignore[misc]
    assert isinstance(keys, ClientKeys)


def test_a_missing_key_file_is_named_with_the_command_that_makes_it(tmp_path):
    with pytest.raises(KeyFileError) as caught:
        load_client_keys(tmp_path)
    message = str(caught.value)
    assert "client.key_secret" in message
    assert f"asyncrl-scheduler keygen {tmp_path}" in message


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("server.key_secret", "not a certificate\n", "public-key and a secret-key"),
        ("server.key_secret", 'curve\n    public-key = "short"\n', "z85"),
        ("client.key", "metadata\ncurve\n", "no public-key"),
    ],
)
def test_a_malformed_key_file_is_named(tmp_path, name, text, words):
    keygen(tmp_path)
    (tmp_path / name).unlink()
    (tmp_path / name).write_text(text)
    with pytest.raises(KeyFileError) as caught:
        load_server_keys(tmp_path)
    assert name in str(caught.value)
    assert words in str(caught.value)
    assert "asyncrl-scheduler keygen" in str(caught.value)


def test_a_secret_that_does_not_match_its_public_key_is_refused(tmp_path):
    keygen(tmp_path)
    public, _ = zmq.curve_keypair()
    secret = load_client_keys(tmp_path).secret
    (tmp_path / "client.key_secret").unlink()
    (tmp_path / "client.key_secret").write_text(
        f'curve\n    public-key = "{public.decode()}"\n    secret-key = "{secret.decode()}"\n'
    )
    with pytest.raises(KeyFileError, match="does not belong"):
        load_client_keys(tmp_path)


@pytest.mark.parametrize(
    ("endpoint", "mode", "expected"),
    [
        # Loopback too: a port on 127.0.0.1 is open to every user of the machine.
        ("tcp://127.0.0.1:5555", "auto", True),
        ("tcp://[::1]:5555", "auto", True),
        ("tcp://localhost:5555", "auto", True),
        ("tcp://0.0.0.0:5555", "auto", True),
        ("tcp://10.1.2.3:5555", "auto", True),
        ("tcp://scheduler.internal:5555", "auto", True),
        # ipc:// is closed by its directory's modes; inproc:// never leaves the process.
        ("ipc:///run/x/control", "auto", False),
        ("inproc://bus", "auto", False),
        ("ipc:///run/x/control", "on", True),
        ("tcp://10.1.2.3:5555", "off", False),
    ],
)
def test_curve_required(endpoint, mode, expected):
    assert curve_required(endpoint, mode) is expected


def test_curve_required_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="'auto', 'on', 'off'"):
        curve_required("tcp://127.0.0.1:5555", "yes")  # type: ignore[arg-type]


def test_a_scheduler_makes_keys_once_and_never_replaces_them(tmp_path):
    assert ensure_keys(tmp_path / "keys") is True
    made = load_server_keys(tmp_path / "keys")
    assert ensure_keys(tmp_path / "keys") is False
    assert load_server_keys(tmp_path / "keys") == made
    assert stat.S_IMODE((tmp_path / "keys" / "client.key_secret").stat().st_mode) == 0o600


def test_the_payload_key_pair_is_the_same_from_the_same_seed_and_nobody_elses():
    keys = payload_keys(b"s" * 32)
    assert keys == payload_keys(b"s" * 32)
    assert zmq.curve_public(keys.secret) == keys.public == keys.server_public
    assert payload_keys(b"t" * 32).public != keys.public
    assert keys.secret.decode() not in repr(keys)
    with pytest.raises(ValueError, match="32 bytes"):
        payload_keys(b"short")
