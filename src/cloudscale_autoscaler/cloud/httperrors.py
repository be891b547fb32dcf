"""HTTP error responses -> typed CloudErrors carrying the API's own words (never the token)."""

from __future__ import annotations

import json
import re
from typing import Any

from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CapacityError,
    CloudError,
    HostShortageError,
    InvalidRequestError,
    NotFoundError,
    QuotaExceededError,
    RateLimitedError,
    ServerGroupFullError,
    ServerGroupGoneError,
    UnavailableError,
)

# Long enough for any DRF message, short enough that an HTML error page cannot flood logs.
MAX_MESSAGE_CHARS = 500
REDACTED = "<redacted>"
# Shorter "secrets" (test tokens like "t") would shred every message they occur in; real
# cloudscale tokens are 32+ characters.
MIN_SECRET_CHARS = 4
# Keys whose name adds nothing to the message they carry.
_UNNAMED_KEYS = frozenset({"detail", "non_field_errors", "message", "error"})


def redact(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, REDACTED)
    return text


def _flatten(value: Any, path: str, out: list[str]) -> None:
    """Collects "path: message" lines from DRF error bodies, nested or not."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = "" if key in _UNNAMED_KEYS else str(key)
            _flatten(item, f"{path}.{name}" if path and name else path or name, out)
    elif isinstance(value, list):
        # A list of plain strings is one field's messages; anything else is indexed.
        if all(isinstance(item, str) for item in value):
            if value:
                out.append(_line(path, " ".join(value)))
        else:
            for index, item in enumerate(value):
                _flatten(item, f"{path}.{index}" if path else str(index), out)
    elif value is not None:
        out.append(_line(path, str(value)))


def _line(path: str, text: str) -> str:
    return f"{path}: {text}" if path else text


def api_message(body: bytes, reason: str = "", secrets: tuple[str, ...] = ()) -> str:
    """The API's own error text: DRF `detail`, or field errors flattened to
    "name: This field is required.; mtu: ..."; raw text for non-JSON bodies."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    lines: list[str] = []
    if parsed is not None:
        _flatten(parsed, "", lines)
    message = "; ".join(lines) if lines else text or reason or "no error message"
    # Redact before truncating, so a cut can never leave part of a secret behind.
    message = redact(message, secrets)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    return message


# A create refused because of its server group, recognised by the API's wording (documented
# assumption shared with the emulator, docs/emulator.md): a message line is about a server
# group when its field is `server_groups` (DRF: "server_groups: ..." or "server_groups.0: ...")
# or its text names a "server group"; such a line is one of these refusals by its words.
_FIELD_LINE = re.compile(r"([A-Za-z0-9_.-]+): (.*)", re.DOTALL)
_SERVER_GROUP_REFUSALS: tuple[tuple[re.Pattern[str], type[CloudError]], ...] = (
    (re.compile(r"\bhosts?\b"), HostShortageError),
    (re.compile(r"\bfull\b"), ServerGroupFullError),
    (re.compile(r"\bdoes not exist\b|\bnot found\b"), ServerGroupGoneError),
)


def server_group_refusal(message: str) -> type[CloudError] | None:
    """The class of a 4xx whose every line (api_message joins them with "; ") is about a server
    group and one of which is recognised; None otherwise, e.g. when another field is refused
    as well (then the request is invalid whatever happens to the group)."""
    found: type[CloudError] | None = None
    for line in message.split("; "):
        field = _FIELD_LINE.fullmatch(line)
        path, text = (field.group(1), field.group(2)) if field else ("", line)
        text = text.lower()
        if path.split(".")[0] != "server_groups" and "server group" not in text:
            return None
        if found is None:
            found = next((cls for words, cls in _SERVER_GROUP_REFUSALS if words.search(text)), None)
    return found


def error_for_status(status: int, message: str, operation: str) -> CloudError:
    """Classifies a non-2xx response. Quota, capacity and the server-group refusals are
    recognised by the API's wording (documented assumption shared with the emulator)."""
    if status in (401, 403):
        return AuthenticationError(message, status, operation)
    if status == 404:
        return NotFoundError(message, status, operation)
    if status == 429:
        return RateLimitedError(message, status, operation)
    if status >= 500:
        return UnavailableError(message, status, operation)
    if 400 <= status < 500:
        refusal = server_group_refusal(message)
        if refusal is not None:
            return refusal(message, status, operation)
        lowered = message.lower()
        if "quota" in lowered:
            return QuotaExceededError(message, status, operation)
        if "capacity" in lowered:
            return CapacityError(message, status, operation)
        return InvalidRequestError(message, status, operation)
    return CloudError(f"unexpected HTTP status: {message}", status, operation)


def error_from_response(
    status: int, body: bytes, reason: str, operation: str, secrets: tuple[str, ...]
) -> CloudError:
    return error_for_status(status, api_message(body, reason, secrets), operation)
