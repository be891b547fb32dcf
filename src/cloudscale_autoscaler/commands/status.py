"""`cloudscale-autoscaler status [--url URL] [--output table|json]`: what a running provider
knows, read from its metrics endpoint's `GET /status` (status.py builds that document).

The table is for a person at a terminal: one row per node group, then the failed-creation
placeholders with the cloud's error text, then the last Refresh, the leader and the served
certificate. Times are shown relative to the moment the provider took the snapshot, so the
two machines' clocks need not agree. `--output json` prints the document as served.
An endpoint that does not answer, or answers with something else, is one line on stderr
and exit code 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

TIMEOUT_SECONDS = 10.0  # the endpoint answers from memory: longer means it is stuck
EXIT_OK = 0
EXIT_ERROR = 1

GROUP_HEADER = ("GROUP", "MIN", "MAX", "TARGET", "RUNNING", "CREATING", "DELETING", "ERROR",
                "SENT", "QUEUED", "PLACEHOLDERS", "SERVER GROUPS", "LAST INCREASE",
                "LAST DELETE")  # fmt: skip
PLACEHOLDER_HEADER = ("GROUP", "PLACEHOLDER", "CLASS", "CODE", "AGE", "EXPIRES IN", "ERROR")
EXPECTED_URL = "http://HOST:PORT/status, or HOST:PORT"
# Appended to TARGET when it is below MIN: CA does not add nodes to reach minSize by itself.
BELOW_MIN = "(<MIN)"


class BadAnswer(Exception):
    """The URL answered, but not with a provider's status document."""


def status_command(url: str, output: str) -> int:
    try:
        url = status_url(url)
    except ValueError as error:
        return _bad_url(url, error)
    try:
        document = fetch(url)
        text = render_json(document) if output == "json" else render_table(document)
    except httpx.InvalidURL as error:  # e.g. a port out of range
        return _bad_url(url, error)
    except httpx.HTTPError as error:
        return _fail(f"cannot read {url}: {str(error) or type(error).__name__}")
    except BadAnswer as error:
        return _fail(f"{url} answered, but not with a cloudscale-autoscaler status: {error}")
    sys.stdout.write(text)
    return EXIT_OK


def _bad_url(url: str, error: Exception) -> int:
    return _fail(f"--url {url!r}: {error}; expected {EXPECTED_URL}")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def status_url(url: str) -> str:
    """`url` as given, with http:// before a bare HOST:PORT, and /status appended when it
    names only the endpoint's address; raises ValueError for one that is no http(s) URL."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("not an http:// or https:// URL with a host")
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path="/status"))
    return urlunsplit(parts)


def fetch(url: str) -> dict[str, Any]:
    """The status document at `url`; raises httpx.HTTPError, httpx.InvalidURL, BadAnswer."""
    response = httpx.get(url, timeout=TIMEOUT_SECONDS)
    if response.status_code != httpx.codes.OK:
        first = response.text.strip().splitlines()[:1]
        raise BadAnswer(f"HTTP {response.status_code} {' '.join(first)}".strip())
    try:
        document = response.json()
    except ValueError as error:
        raise BadAnswer(f"the body is not JSON ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("groups"), list):
        raise BadAnswer("a JSON document without a list of 'groups'")
    return document


def render_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def render_table(document: dict[str, Any]) -> str:
    """The table a person reads; raises BadAnswer naming a field the document lacks."""
    try:
        return _render(document)
    except KeyError as error:
        raise BadAnswer(f"no field {error} in the document") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise BadAnswer(f"a field of unexpected type ({error})") from None


def _render(document: dict[str, Any]) -> str:
    now = float(document["at_unix"])
    groups = document["groups"]
    out = _table([GROUP_HEADER, *(_group_row(group, now) for group in groups)])
    placeholders = [(group["name"], p) for group in groups for p in group["placeholders"]]
    if placeholders:
        out += "\n" + _table(
            [PLACEHOLDER_HEADER, *(_placeholder_row(name, p) for name, p in placeholders)]
        )
    lines = [
        *_below_min_lines(groups),
        _refresh_line(document["refresh"], document["last_successful_refresh_unix"], now),
        _leader_line(document["leader"]),
        _tls_line(document["tls_not_after_unix"], now),
        *_config_lines(document["config"], now),
        *_unconfigured_lines(document["unconfigured_groups"]),
    ]
    return out + "\n" + "\n".join(lines) + "\n"


def _group_row(group: dict[str, Any], now: float) -> tuple[str, ...]:
    servers = group["servers"]
    calls = group["calls"]
    figures = (
        group["min_size"],
        group["max_size"],
        group["target_size"],
        servers["running"],
        servers["creating"],
        servers["deleting"],
        servers["error"],
        group["creations_in_flight"],
        group["creations_queued"],
        len(group["placeholders"]),
        group["server_groups"],
    )
    shown = [str(int(figure)) for figure in figures]
    if _below_min(group):
        shown[2] += f" {BELOW_MIN}"
    return (
        str(group["name"]),
        *shown,
        _last_call(calls.get("NodeGroupIncreaseSize"), now),
        _last_call(calls.get("NodeGroupDeleteNodes"), now),
    )


def _below_min(group: dict[str, Any]) -> bool:
    return bool(group["below_min_size"])


def _below_min_lines(groups: list[dict[str, Any]]) -> list[str]:
    """Why a group is flagged: CA keeps a group at or above minSize when it scales down, but
    does not scale one up to it (unless run with --enforce-node-group-min-size)."""
    return [
        f"below minSize: {group['name']} has a target of {int(group['target_size'])}, "
        f"minSize is {int(group['min_size'])}: CA adds nodes to it only for pods that need "
        "them, or with --enforce-node-group-min-size"
        for group in groups
        if _below_min(group)
    ]


def _last_call(seen: dict[str, Any] | None, now: float) -> str:
    if seen is None:
        return "-"
    return f"{duration(now - float(seen['last_unix']))} ago ({int(seen['count'])}x)"


def _placeholder_row(group: str, placeholder: dict[str, Any]) -> tuple[str, ...]:
    return (
        group,
        str(placeholder["provider_id"]),
        str(placeholder["error_class"]),
        str(placeholder["error_code"]),
        duration(float(placeholder["age_seconds"])),
        duration(float(placeholder["expires_in_seconds"])),
        " ".join(str(placeholder["error"]).split()),  # one line, whatever the cloud wrote
    )


def _config_lines(config: dict[str, Any] | None, now: float) -> list[str]:
    if config is None:
        return []
    loaded = f"config:  {config['path']}, loaded {duration(now - float(config['loaded_unix']))} ago"
    if config["ok"] is not False:
        return [loaded]
    tried = duration(now - float(config["attempt_unix"]))
    refused = [f"config:  RELOAD REFUSED {tried} ago, the running configuration is kept:"]
    return [loaded, *refused, *(f"  {error}" for error in config["errors"])]


def _unconfigured_lines(groups: dict[str, dict[str, int]]) -> list[str]:
    return [
        f"unconfigured group {name}: {left['servers']} server(s), "
        f"{left['creations_in_flight']} create(s) in flight, {left['server_groups']} managed "
        "server group(s) kept, not served (no such node group is configured)"
        for name, left in sorted(groups.items())
    ]


def _refresh_line(refresh: dict[str, Any] | None, success: float | None, now: float) -> str:
    if refresh is None:
        return "refresh: none yet"
    when = f"{duration(now - float(refresh['at_unix']))} ago, took {refresh['seconds']:.2f}s"
    if refresh["error"] is None:
        return f"refresh: ok {when}"
    last_ok = f"{duration(now - float(success))} ago" if success else "never"
    return f"refresh: FAILED {when} (last success: {last_ok}): {refresh['error']}"


def _leader_line(leader: dict[str, Any] | None) -> str:
    if leader is None:
        return "leader:  no leader election (this replica serves)"
    lease = f"Lease {leader['lease']}"
    if leader["leading"]:
        return f"leader:  this replica ({leader['identity']}) leads ({lease})"
    holder = leader["holder"] or "unknown"
    return f"leader:  this replica ({leader['identity']}) is a standby; {lease} held by {holder}"


def _tls_line(not_after: float | None, now: float) -> str:
    if not_after is None:
        return "tls:     off (plaintext gRPC)"
    stamp = datetime.fromtimestamp(float(not_after), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    left = float(not_after) - now
    when = f"in {duration(left)}" if left > 0 else f"EXPIRED {duration(-left)} ago"
    return f"tls:     certificate expires {stamp} ({when})"


def duration(seconds: float) -> str:
    """A span as a person reads it: 42s, 4m05s, 3h07m, 12d04h."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             for row in rows]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines) + "\n"
