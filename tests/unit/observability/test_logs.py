"""`mop.observability.logs`: one JSON object per line with the fields passed in `extra=`, the
handler `configure_logging` installs (and replaces), and levels changed at run time."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from mop.observability.logs import JsonFormatter, configure_logging, log_levels, set_log_level


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put the process's logging back as it was: these tests change global state."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    named = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger):
            logger.setLevel(named.get(name, logging.NOTSET))


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.getLogger("mop.test.logs").makeRecord(
        "mop.test.logs", logging.WARNING, __file__, 1, msg, args, None, extra=extra
    )
    made.created = 1_700_000_000.25
    return made


def test_a_record_is_one_json_line_with_its_extra_fields() -> None:
    line = JsonFormatter().format(
        record("%s connected", "c1", client_id="c1", clean_start=True, peer=("::1", 5))
    )
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2023-11-14T22:13:20.250Z",
        "level": "WARNING",
        "logger": "mop.test.logs",
        "message": "c1 connected",
        "client_id": "c1",
        "clean_start": True,
        "peer": ["::1", 5],
    }


def test_values_json_cannot_hold_are_strings_and_core_fields_win() -> None:
    document = json.loads(JsonFormatter().format(record("x", level="mine", when=b"b")))
    assert document["level"] == "WARNING"
    assert document["when"] == "b'b'"


def test_a_traceback_is_a_field_of_the_same_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        line = JsonFormatter().format(
            logging.getLogger("t").makeRecord(
                "t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
            )
        )
    assert line.count("\n") == 0
    document = json.loads(line)
    assert document["message"] == "failed"
    assert "RuntimeError: boom" in document["exception"]


def test_configure_logging_writes_json_lines_and_replaces_its_own_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("INFO", "json", stream=first)
    configure_logging("INFO", "json", stream=second)
    log = logging.getLogger("mop.test.configure")
    log.info("hello %s", "there", extra={"client_id": "c9"})
    log.debug("not written")
    assert first.getvalue() == ""
    [line] = second.getvalue().splitlines()
    document = json.loads(line)
    assert (document["message"], document["client_id"], document["level"]) == (
        "hello there",
        "c9",
        "INFO",
    )


def test_configure_logging_writes_text_lines() -> None:
    stream = io.StringIO()
    configure_logging("WARNING", "text", stream=stream)
    logging.getLogger("mop.test.text").warning("disk %s", "full", extra={"ignored": 1})
    assert stream.getvalue().rstrip().endswith("WARNING mop.test.text: disk full")


def test_levels_change_at_run_time() -> None:
    set_log_level("info")
    set_log_level("DEBUG", "mop.test.levels")
    levels = log_levels()
    assert levels["level"] == "INFO"
    assert levels["loggers"]["mop.test.levels"] == "DEBUG"
    assert logging.getLogger("mop.test.levels.below").isEnabledFor(logging.DEBUG)
    set_log_level("NOTSET", "mop.test.levels")  # follows its parent again
    assert "mop.test.levels" not in log_levels()["loggers"]
    assert not logging.getLogger("mop.test.levels.below").isEnabledFor(logging.DEBUG)


@pytest.mark.parametrize(("level", "logger"), [("LOUD", None), ("NOTSET", None), ("", "mop")])
def test_unknown_levels_are_refused(level: str, logger: str | None) -> None:
    before = log_levels()
    with pytest.raises(ValueError, match="unknown log level"):
        set_log_level(level, logger)
    assert log_levels() == before
