"""One journal record and its text form (pure: no I/O).

The text is JSON:

    {"format": 1, "cluster": "prod", "holder": "provider-7c9-x2", "creations": [
        {"request": "9f2c...", "group": "workers", "name": "prod-workers-ab12cd34",
         "at": "2026-11-27T10:00:00Z"}, ...]}

`request` is the create's k8s-autoscaler-request tag: a listed server carrying it IS that
create. `at` is when it was recorded, by the writer's wall clock; it is for people and logs,
never compared with the reader's clock (two nodes' clocks need not agree). `serverGroup`, only
for a node group with antiAffinity, is the uuid of the managed server group the create joins:
the next holder counts it there, so it never places a fifth member into a full group. It is
recorded before the create is sent (a create into a server group still being made waits for a
second write naming it); older records lack it, and readers before it ignore it.

`doubt`, while set, says why its holder holds scale-ups: it claimed a record it could not read
whole, so creates a dead holder sent are unknown. The holder clears it once its hold ends; a
holder that dies first leaves it, and the next one holds scale-ups too (from its own claim: the
hold must outlive every create the lost record may have held, and the dead holder's hold ended
with it).
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

FORMAT = 1
_FIELDS = ("request", "group", "name", "at")
# Shows a value read from a record in a message: bounded in depth and length, so a crafted
# record (a list nested a thousand deep) cannot make the message itself fail.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 80, 80


@dataclass(frozen=True)
class Entry:
    request: str
    group: str
    name: str
    at: str
    server_group: str | None = None


@dataclass
class Decoded:
    """A record as read: its holder, the entries that could be read, and what could not."""

    holder: str = ""
    entries: list[Entry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    doubt: str | None = None  # the holder's, still open


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode(cluster: str, holder: str, entries: list[Entry], doubt: str | None = None) -> str:
    creations = [_written(entry) for entry in entries]
    body: dict[str, Any] = {"format": FORMAT, "cluster": cluster, "holder": holder}
    if doubt is not None:
        body["doubt"] = doubt
    body["creations"] = creations
    return json.dumps(body, separators=(",", ":"))


def decode(text: str, cluster: str) -> Decoded:
    """The entries of a record for `cluster`. Never raises: a record that cannot be read, or
    was written for another cluster, yields no entries and says why in `problems`."""
    try:
        body = json.loads(text)
    except ValueError as exc:  # UnicodeError (a lone surrogate) is one too
        return Decoded(problems=[f"not JSON ({_SHOWN.repr(str(exc))}); truncated or overwritten?"])
    except RecursionError:
        return Decoded(problems=["not JSON this provider can read: nested too deeply; crafted?"])
    if not isinstance(body, dict):
        return Decoded(problems=[f"expected a JSON object, got {type(body).__name__}"])
    if body.get("format") != FORMAT:
        return Decoded(problems=[f"format {_SHOWN.repr(body.get('format'))} is not {FORMAT}"])
    if body.get("cluster") != cluster:
        written = _SHOWN.repr(body.get("cluster"))
        return Decoded(problems=[f"written for cluster {written}, not {cluster!r}: foreign"])
    holder, doubt = body.get("holder"), body.get("doubt")
    decoded = Decoded(holder=holder if isinstance(holder, str) else "")
    if doubt is not None:  # any value: a holder doubted, whatever it wrote
        decoded.doubt = doubt if isinstance(doubt, str) and doubt else _SHOWN.repr(doubt)
    creations = body.get("creations")
    if not isinstance(creations, list):
        decoded.problems.append("`creations` is not a list")
        return decoded
    for index, raw in enumerate(creations):
        entry = _entry(raw)
        if entry is None:
            shown = _SHOWN.repr(raw)
            decoded.problems.append(f"creations[{index}]: expected {_shape()}, got {shown}")
        else:
            decoded.entries.append(entry)
    return decoded


def _written(entry: Entry) -> dict[str, str]:
    fields = {name: getattr(entry, name) for name in _FIELDS}
    if entry.server_group is not None:
        fields["serverGroup"] = entry.server_group
    return fields


def _entry(raw: Any) -> Entry | None:
    if not isinstance(raw, dict):
        return None
    values = [raw.get(name) for name in _FIELDS]
    texts = [value for value in values if isinstance(value, str) and value]
    if len(texts) != len(_FIELDS):
        return None
    request, group, name, at = texts
    server_group = raw.get("serverGroup")
    return Entry(request, group, name, at, server_group if isinstance(server_group, str) else None)


def _shape() -> str:
    return "{" + ", ".join(f'"{name}": <string>' for name in _FIELDS) + "}"
