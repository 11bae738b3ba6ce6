"""The daemon's log: one handler on the root logger, in one of two formats, for our lines
and uvicorn's alike.

- ``text`` (default): ``2026-01-01 12:00:00,000 INFO supervisor: ready -> stopping (...)``.
- ``json``: one object per line — ``time`` (ISO 8601, UTC), ``level``, ``logger``,
  ``message``, the ``extra`` fields a line carries (``outcome``, ``duration_s``...) and
  ``exc_info`` with the traceback; a line logged while an operation runs (in its task or a
  worker thread of it) carries that operation's ``operation_id``, ``kind``, ``phase`` and
  ``state`` (``sglang_supervisor.observe.oplog.OperationFields``). Written by
  python-json-logger.

Under systemd (``$JOURNAL_STREAM`` names the stderr we write to), each line starts with
its syslog priority (``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug), which
journald strips and records: ``journalctl -p warning -u sglang-supervisor`` then shows
rollbacks and crashes. The timestamp is left out there (journald adds its own).

Every record passes the one redaction rule (``sglang_supervisor.redact``) on its way out:
a reason that quotes the server's log or a command line shows no secret here either.

uvicorn must not install its own handlers: pass :data:`UVICORN_LOG_CONFIG` as
``uvicorn.Config(log_config=...)``; its loggers then propagate to this handler.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from sglang_supervisor.observe.oplog import OperationFields
from sglang_supervisor.redact import redact_text

FORMATS = ("text", "json")
#: ``uvicorn.Config(log_config=UVICORN_LOG_CONFIG)``: uvicorn configures no handlers.
UVICORN_LOG_CONFIG: None = None
#: syslog priorities (sd-daemon(3)) by logging level.
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
#: LogRecord attributes that are not ``extra`` fields.
_STANDARD = sorted(
    {*RESERVED_ATTRS, *vars(logging.LogRecord("n", logging.INFO, "p", 1, "m", None, None))}
    # uvicorn adds color_message (the message with ANSI colours) to some of its lines.
    | {"message", "asctime", "taskName", "color_message"}
)


def syslog_priority(levelno: int) -> int:
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return _PRIORITY[level]
    return _PRIORITY[logging.DEBUG]


def writes_to_journal(stream: TextIO) -> bool:
    """True when ``stream`` is the journal stream systemd gave us (``$JOURNAL_STREAM`` is
    ``<device>:<inode>`` of it; a redirected stderr under systemd does not match)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


class JsonFormatter(_JsonFormatter):
    """python-json-logger's, with this daemon's keys: ``time`` first (UTC, milliseconds),
    ``level``, ``logger``, ``message``, then the extras; a value JSON has no type for as its
    ``str``."""

    def __init__(self) -> None:
        super().__init__(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger"},
            reserved_attrs=_STANDARD,
            json_default=str,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        created = datetime.fromtimestamp(record.created, UTC)
        log_data["time"] = created.isoformat(timespec="milliseconds")
        super().add_fields(log_data, record, message_dict)

    def formatException(self, ei: Any) -> str:
        # python-json-logger formats the traceback anew rather than reading the
        # ``exc_text`` the Redacting filter left: hide secrets here too (one string:
        # ``exc_info_as_array`` is off).
        return redact_text(str(super().formatException(ei)))


class _Journal(logging.Formatter):
    """Prefixes every line of ``inner``'s output with the record's syslog priority."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self.inner.format(record).splitlines())


class Redacting(logging.Filter):
    """Hides secrets in a log record's message and traceback (``redact.redact_text``)."""

    def filter(self, line: logging.LogRecord) -> bool:
        # (Not named "record": that name is the engine's server record, one writer.)
        message = line.getMessage()
        hidden = redact_text(message)
        if hidden != message:
            line.msg, line.args = hidden, None
        if line.exc_info and not line.exc_text:
            line.exc_text = redact_text(logging.Formatter().formatException(line.exc_info))
        return True


def make_formatter(fmt: str, journal: bool) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; one of {', '.join(FORMATS)}")
    inner: logging.Formatter
    if fmt == "json":
        inner = JsonFormatter()
    elif journal:
        inner = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    else:
        inner = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    return _Journal(inner) if journal else inner


def setup_logging(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one writing ``fmt`` to ``stream`` (stderr).

    uvicorn's loggers (``uvicorn``, ``uvicorn.error``, ``uvicorn.access``) are cleared and
    propagate here. Raises ``ValueError`` on an unknown format or level.
    """
    out = stream if stream is not None else sys.stderr
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(out)
    handler.setFormatter(make_formatter(fmt, writes_to_journal(out)))
    handler.addFilter(OperationFields())
    handler.addFilter(Redacting())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
