"""Logging setup: the fields every line carries, redaction, stdlib routing, reconfiguring."""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog

from asyncrl.runtime.contract.logs import configure_logging, get_logger

SECRET = "hunter2-do-not-print"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put the root logger, warnings capture and structlog back as they were before the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_json_line_carries_time_level_event_process_and_pid(tmp_path: Path) -> None:
    log_file = tmp_path / "run" / "logs" / "generate-0.log"  # parent folders do not exist yet
    configure_logging(process="generate-0", file=log_file)

    get_logger("asyncrl.test").info("batch done", step=3)

    [line] = lines(log_file)
    assert line["event"] == "batch done"
    assert line["level"] == "info"
    assert line["process"] == "generate-0"
    assert line["pid"] == os.getpid()
    assert line["step"] == 3
    assert line["logger"] == "asyncrl.test"
    assert datetime.fromisoformat(line["timestamp"]).utcoffset() == timedelta(0)


def test_a_secret_never_reaches_the_output(tmp_path: Path) -> None:
    log_file = tmp_path / "secrets.log"
    configure_logging(process="scheduler", file=log_file)
    log = get_logger("asyncrl.test").bind(db_password=SECRET)

    log.info("connecting", private_key=SECRET, curve_secretkey=SECRET, user="ann")
    log.info("nested", transport={"Client_Secret": SECRET, "port": 5555})
    log.warning("keys", aws_secret_key=SECRET, secret=SECRET)
    logging.getLogger("somelib").warning("stdlib too", extra={"password": SECRET})
    with structlog.contextvars.bound_contextvars(api_secret=SECRET):
        log.error("from context")

    text = log_file.read_text()
    assert SECRET not in text
    first, nested, keys, stdlib, context = lines(log_file)
    assert first["private_key"] == first["curve_secretkey"] == first["db_password"] == "[redacted]"
    assert first["user"] == "ann"  # only secret-named fields are touched
    assert nested["transport"] == {"Client_Secret": "[redacted]", "port": 5555}
    assert keys["aws_secret_key"] == keys["secret"] == "[redacted]"
    assert stdlib["password"] == "[redacted]"
    assert context["api_secret"] == "[redacted]"


def test_credentials_of_the_api_and_the_bus_never_reach_the_output(tmp_path: Path) -> None:
    log_file = tmp_path / "credentials.log"
    configure_logging(process="generate-0", file=log_file)
    log = get_logger("asyncrl.test")

    log.info("api", api_key=SECRET, token=SECRET, Authorization=f"Bearer {SECRET}")
    log.info("worker", worker_key=SECRET, ASYNCRL_WORKER_KEY=SECRET, access_token=SECRET)
    log.info("headers", headers=[{"X-Api-Key": SECRET}, {"authorization": SECRET}])
    log.warning(f"refused: header Authorization: Bearer {SECRET}", eos_token="</s>")

    text = log_file.read_text()
    assert SECRET not in text
    api, worker, headers, refused = lines(log_file)
    assert api["api_key"] == api["token"] == api["Authorization"] == "[redacted]"
    assert worker["worker_key"] == worker["ASYNCRL_WORKER_KEY"] == "[redacted]"
    assert worker["access_token"] == "[redacted]"
    assert headers["headers"] == [{"X-Api-Key": "[redacted]"}, {"authorization": "[redacted]"}]
    assert refused["event"] == "refused: header Authorization: Bearer [redacted]"
    assert refused["eos_token"] == "</s>"  # a vocabulary token is no credential


def test_standard_library_logging_and_warnings_land_in_the_same_output(tmp_path: Path) -> None:
    log_file = tmp_path / "train-0.log"
    configure_logging(process="train-0", file=log_file)

    logging.getLogger("somelib.io").warning("retrying %s", "connect")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated knob", DeprecationWarning, stacklevel=1)

    library, warned = lines(log_file)
    assert library["event"] == "retrying connect"
    assert library["level"] == "warning"
    assert library["logger"] == "somelib.io"
    assert library["process"] == "train-0"
    assert library["pid"] == os.getpid()
    assert "deprecated knob" in warned["event"]
    assert warned["logger"] == "py.warnings"


def test_lines_below_the_level_are_dropped(tmp_path: Path) -> None:
    log_file = tmp_path / "x.log"
    configure_logging(process="x", level="warning", file=log_file)

    get_logger("asyncrl.test").info("quiet")
    logging.getLogger("somelib").info("quiet too")
    get_logger("asyncrl.test").warning("loud")

    assert [line["event"] for line in lines(log_file)] == ["loud"]


def test_an_exception_is_one_json_line_with_its_traceback(tmp_path: Path) -> None:
    log_file = tmp_path / "x.log"
    configure_logging(process="x", file=log_file)

    try:
        raise RuntimeError("disk on fire")
    except RuntimeError:
        get_logger("asyncrl.test").exception("step failed")

    [line] = lines(log_file)
    assert line["level"] == "error"
    assert "RuntimeError: disk on fire" in line["exception"]


def test_console_format_is_text_for_people(tmp_path: Path) -> None:
    log_file = tmp_path / "x.log"
    configure_logging(process="scheduler", fmt="console", file=log_file)

    get_logger("asyncrl.test").info("ready", port=5555, password=SECRET)

    text = log_file.read_text()
    assert not text.startswith("{")
    assert "ready" in text
    assert "port=5555" in text
    assert "process=scheduler" in text
    assert SECRET not in text
    assert "\x1b[" not in text  # no colour codes in a file


def test_without_a_file_lines_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(process="scheduler")

    get_logger("asyncrl.test").info("hello")

    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err)["event"] == "hello"


def test_configuring_again_replaces_the_output(tmp_path: Path) -> None:
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    first.write_text('{"event": "from before"}\n')
    configure_logging(process="a", file=first)
    log = get_logger("asyncrl.test")
    log.info("one")

    configure_logging(process="b", file=second)
    configure_logging(process="b", file=second)
    log.info("two")  # a logger made earlier follows the new configuration

    assert [line["event"] for line in lines(first)] == ["from before", "one"]  # appended
    [line] = lines(second)
    assert (line["event"], line["process"]) == ("two", "b")


@pytest.mark.parametrize(("option", "value"), [("level", "verbose"), ("fmt", "xml")])
def test_an_unknown_level_or_format_is_refused(option: str, value: str) -> None:
    with pytest.raises(ValueError, match=value):
        configure_logging(process="x", **{option: value})
