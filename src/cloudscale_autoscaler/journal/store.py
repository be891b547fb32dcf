"""Where a journal record is kept: the protocol every store meets, and its errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class JournalError(Exception):
    """The record could not be read or written; the message names the record and why."""


class Conflict(JournalError):
    """The record changed since it was read: someone else wrote it."""


class Gone(JournalError):
    """The record was deleted since it was read or written (a ConfigMap deleted by hand)."""


@dataclass(frozen=True)
class Stored:
    """A record as a store holds it: its text (None: no record yet) and the version a write
    must name to replace it (None: the store does not compare versions). `missing`: the
    object that holds the record, which the installer makes, does not exist (deleted)."""

    text: str | None
    version: str | None = None
    missing: bool = False


class JournalStore(Protocol):
    # What the record is, for messages: "ConfigMap kube-system/x", "file /var/lib/x/y.json".
    where: str

    async def read(self) -> Stored: ...

    async def write(self, text: str, version: str | None) -> str | None:
        """Replace the record with `text` if it is still at `version` (Conflict otherwise);
        the new version."""
        ...
