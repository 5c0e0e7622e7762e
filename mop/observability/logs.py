"""A node process's log: the format of its lines (`configure_logging`, which `mop run` calls) and
the levels, which the admin API reads and changes at run time (`log_levels`, `set_log_level`).

One line per event. In the "json" format each line is one object: `time` (UTC, ISO 8601 with
milliseconds), `level`, `logger`, `message`, then the fields the call passed with `extra=`
(`log.info("...", extra={"client_id": ...})`), and `exception` when a traceback comes with it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import IO, Any, Final, Literal

__all__ = [
    "LEVELS",
    "TEXT_FORMAT",
    "JsonFormatter",
    "configure_logging",
    "log_levels",
    "set_log_level",
]

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# A logger given this level follows its parent's again.
INHERIT: Final = "NOTSET"
# The name of the handler `configure_logging` installs, so that calling it again replaces it.
_HANDLER: Final = "mop"
# What every record has; any other attribute came with `extra=`.
_RECORD_ATTRIBUTES: Final = frozenset(
    {*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON (see the module's docstring). A field passed with `extra=`
    under a name the line has already (`time`, `level`, `logger`) is left out; values JSON
    cannot hold are written as their `str`."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _RECORD_ATTRIBUTES and not name.startswith("_"):
                document.setdefault(name, value)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str, ensure_ascii=False)


def _utc(timestamp: float) -> str:
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def configure_logging(
    level: str, log_format: Literal["text", "json"] = "text", *, stream: IO[str] | None = None
) -> logging.Handler:
    """Send every log line to `stream` (default: standard error) in `log_format`, at `level`
    and above; calling it again replaces what the previous call set up. ValueError for an
    unknown level."""
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler = logging.StreamHandler(stream)
    handler.set_name(_HANDLER)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    set_log_level(level)
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)
    root.addHandler(handler)
    return handler


def set_log_level(level: str, logger: str | None = None) -> None:
    """Log at `level` (one of `LEVELS`, any case) and above: the whole process, or only the
    logger named `logger` and those below it, which may also be given "NOTSET" to follow
    its parent again. ValueError for any other level."""
    name = level.upper()
    if name not in LEVELS and not (logger and name == INHERIT):
        allowed = ", ".join(LEVELS) + (f" or {INHERIT}" if logger else "")
        raise ValueError(f"unknown log level {level!r}: use {allowed}")
    logging.getLogger(logger or None).setLevel(name)


def log_levels() -> dict[str, Any]:
    """The process's level and the loggers that have one of their own:
    `{"level": "INFO", "loggers": {"mop.mqtt": "DEBUG"}}`."""
    loggers = {
        name: logging.getLevelName(logger.level)
        for name, logger in sorted(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
    }
    return {"level": logging.getLevelName(logging.getLogger().level), "loggers": loggers}
