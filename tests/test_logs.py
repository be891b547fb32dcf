"""Logging setup: formats, extra fields, request ids, secret redaction."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from cloudscale_autoscaler.observability import logs

SECRET = "s3cr3t-token-value-0123456789"


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _emit(capsys: pytest.CaptureFixture[str], fmt: str, *args: object, **extra: object) -> str:
    logs.setup_logging(fmt, "debug")
    logging.getLogger("cloudscale_autoscaler.test_logs").info(*args, extra=extra)
    return capsys.readouterr().err.strip()


def test_json_line_has_fields_and_extras(capsys: pytest.CaptureFixture[str]) -> None:
    line = _emit(capsys, "json", "scaled %s", "workers", group="workers", delta=2)
    record = json.loads(line)
    assert record["level"] == "info"
    assert record["logger"] == "cloudscale_autoscaler.test_logs"
    assert record["message"] == "scaled workers"
    assert (record["group"], record["delta"]) == ("workers", 2)
    assert record["ts"].endswith("Z")


def test_plain_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = _emit(capsys, "plain", "hello", group="gpu")
    assert line.endswith("INFO cloudscale_autoscaler.test_logs: hello group=gpu")


def test_request_id_from_context(capsys: pytest.CaptureFixture[str]) -> None:
    token = logs.request_id_var.set("abc-7")
    try:
        line = _emit(capsys, "json", "inside an RPC")
    finally:
        logs.request_id_var.reset(token)
    assert json.loads(line)["request_id"] == "abc-7"


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_registered_secret_is_masked_everywhere(
    capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    logs.register_secret(SECRET)
    logs.setup_logging(fmt, "info")
    log = logging.getLogger("cloudscale_autoscaler.test_logs")
    log.info("token is %s", SECRET, extra={"header": f"Bearer {SECRET}"})
    try:
        raise RuntimeError(f"failed with {SECRET}")
    except RuntimeError:
        log.exception("boom")
    err = capsys.readouterr().err
    assert SECRET not in err
    assert err.count(logs.MASK) >= 3


def test_short_secrets_are_not_registered(capsys: pytest.CaptureFixture[str]) -> None:
    logs.register_secret("abc")
    assert "abc" in _emit(capsys, "plain", "abc stays")


@pytest.mark.parametrize(
    ("fmt", "level", "message"),
    [("xml", "info", "log format 'xml'"), ("json", "loud", "log level 'loud'")],
)
def test_bad_arguments_are_named(fmt: str, level: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        logs.setup_logging(fmt, level)


def test_level_filters_lower_levels(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup_logging("plain", "warning")
    logging.getLogger("cloudscale_autoscaler.test_logs").info("hidden")
    logging.getLogger("cloudscale_autoscaler.test_logs").warning("shown")
    err = capsys.readouterr().err
    assert "shown" in err and "hidden" not in err


def test_debug_shows_our_lines_and_only_warnings_of_other_libraries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.setup_logging("plain", "debug")
    logging.getLogger("cloudscale_autoscaler.engine").debug("ours")
    logging.getLogger("grpc._cython.cygrpc").debug("[_cygrpc] Loaded running loop")
    logging.getLogger("asyncio").info("library info")
    logging.getLogger("grpc._cython.cygrpc").warning("library warning")
    logging.getLogger("httpx").info("HTTP Request: GET /v1/servers")
    err = capsys.readouterr().err
    assert "ours" in err and "library warning" in err
    assert "Loaded running loop" not in err and "library info" not in err
    # Our cloud client logs each API request; httpx's own line would repeat it.
    assert "HTTP Request" not in err
