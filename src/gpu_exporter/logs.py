"""Log lines as the Prometheus exporters write them: logfmt by default, JSON on request.

    ts=2025-05-20T10:00:00.123Z level=info caller=forward/mqtt.py:120 msg="connected to broker" node=edge-7

``ts`` is UTC with milliseconds, ``level`` one of debug/info/warn/error, ``caller`` the source file within
the package and the line, ``msg`` the message; fields passed with ``extra=`` follow as key=value, and a
traceback as ``err``. JSON lines carry the same keys (plus ``logger``). One line per record, always:
newlines inside values are escaped.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

__all__ = ["FORMATS", "JsonFormatter", "LogfmtFormatter", "setup_logging"]

# "text" is the former name of logfmt, still accepted in configuration files.
FORMATS = ("logfmt", "json", "text")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LEVELS = {"WARNING": "warn", "CRITICAL": "error"}
# Attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _caller(record: logging.LogRecord) -> str:
    path = record.pathname
    name = path[len(_PACKAGE_DIR) :] if path.startswith(_PACKAGE_DIR) else os.path.basename(path)
    return f"{name.replace(os.sep, '/')}:{record.lineno}"


def _level(record: logging.LogRecord) -> str:
    return _LEVELS.get(record.levelname, record.levelname.lower())


def _extras(record: logging.LogRecord) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")]


def logfmt_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    escaped = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        pairs: list[tuple[str, object]] = [
            ("ts", _timestamp(record)),
            ("level", _level(record)),
            ("caller", _caller(record)),
            ("msg", record.getMessage()),
        ]
        pairs.extend(_extras(record))
        if record.exc_info:
            pairs.append(("err", self.formatException(record.exc_info)))
        return " ".join(f"{key}={logfmt_value(value)}" for key, value in pairs)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": _level(record),
            "caller": _caller(record),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record):
            entry.setdefault(key, value)
        if record.exc_info:
            entry["err"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str, fmt: str) -> None:
    """Replace the root logger's handlers with one writing ``fmt`` lines to stderr at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel({"warn": logging.WARNING}.get(level, level.upper()))
