"""Logging to stderr as plain text or JSON lines, with request ids and secret redaction.

Extra fields passed with `logger.info("...", extra={"group": "workers"})` appear as `key=value`
(plain) or as JSON keys. The id of the RPC being served (set by the transport for each call it
hands to Python, through `request_id_var`) is added to every record logged while serving it.

Secrets registered with `register_secret` (the cloudscale.ch API token) are masked in the final
output line, whatever path they took into it: message, arguments, extras or a traceback.

`--log-level` applies to our own loggers; other libraries' records reach the output only from
WARNING up, at any level (our cloud client logs each API request itself). What Python reports as
"unraisable" (an exception in a callback the compiled transport made, which has no caller to
raise to) is logged here too, as an error with its traceback, not printed past the format.

A command's messages for the person at the terminal (an invalid config, a warning, a note) go
through `to_stderr`: the text as written in plain format, one JSON record with `--log-format
json`; in both formats whatever `--log-level`, since they are the command's output, not its log.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

FORMATS = ("plain", "json")
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
MASK = "***"
# Shorter strings would mask ordinary words; real API tokens are far longer.
MIN_SECRET_LENGTH = 8

_secrets: set[str] = set()
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "request_id",
}
_HANDLER_MARK = "_cloudscale_autoscaler_handler"
# Loggers whose records below WARNING are shown (at the chosen level): ours only.
_VERBOSE_LOGGERS = ("cloudscale_autoscaler",)


def register_secret(secret: str) -> None:
    """Mask `secret` (and its JSON-escaped form) in every log line from now on."""
    if len(secret) < MIN_SECRET_LENGTH:
        return
    _secrets.add(secret)
    _secrets.add(json.dumps(secret)[1:-1])


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class _ThirdPartyFilter(logging.Filter):
    """Lets other libraries' records through from WARNING up only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        name = record.name
        return any(name == own or name.startswith(own + ".") for own in _VERBOSE_LOGGERS)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    fields = {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}
    request_id = getattr(record, "request_id", None)
    if request_id is not None:
        fields = {"request_id": request_id, **fields}
    return fields


def _timestamp(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class PlainFormatter(logging.Formatter):
    """`<time> <LEVEL> <logger>: <message> key=value ...` plus any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        for key, value in _extras(record).items():
            line += f" {key}={value}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return redact(line)


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            payload.setdefault(key, value)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        return redact(json.dumps(payload, default=str, ensure_ascii=False))


def _log_unraisable(unraisable: Any) -> None:
    """sys.unraisablehook: the exception goes through logging, in the chosen format."""
    if unraisable.object is None:
        message = unraisable.err_msg or "Exception ignored"
    else:
        message = f"{unraisable.err_msg or 'Exception ignored in'}: {unraisable.object!r}"
    exc_info = (unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)
    logging.getLogger("cloudscale_autoscaler.unraisable").error(message, exc_info=exc_info)


def setup_logging(fmt: str, level: str) -> None:
    """Configure the root logger: one stderr handler in `fmt` (plain|json) at `level`."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    numeric = LEVELS.get(level.lower())
    if numeric is None:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else PlainFormatter())
    handler.addFilter(_ThirdPartyFilter())
    handler.addFilter(_RequestIdFilter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    sys.unraisablehook = _log_unraisable
    # Not even created below WARNING: httpx's line per request repeats our client's own
    # debug line, and httpcore's connection chatter is noise.
    for library in ("httpx", "httpcore"):
        logging.getLogger(library).setLevel(logging.WARNING)


def _json_output() -> bool:
    """Whether setup_logging chose JSON: only then must stderr hold nothing but records."""
    return any(
        getattr(handler, _HANDLER_MARK, False) and isinstance(handler.formatter, JSONFormatter)
        for handler in logging.getLogger().handlers
    )


def to_stderr(
    logger: logging.Logger,
    level: int,
    message: str,
    errors: Sequence[str] = (),
    *,
    plain_prefix: str = "",
) -> None:
    """A command's message and its list of errors. Plain: `<prefix><message> (N errors):` and
    each error indented on its own line, as a person reads it. JSON: one record, the errors as
    the list field `errors`, so a log pipeline keeps them together. Shown at any --log-level,
    as plain text is: the record goes to the handlers without the logger's level check."""
    if errors:
        noun = "error" if len(errors) == 1 else "errors"
        message = f"{message} ({len(errors)} {noun})"
    if _json_output():
        extra = {"errors": list(errors)} if errors else None
        logger.handle(logger.makeRecord(logger.name, level, "", 0, message, (), None, extra=extra))
        return
    print(plain_prefix + message + (":" if errors else ""), file=sys.stderr)
    for error in errors:
        print(f"  {error}", file=sys.stderr)
