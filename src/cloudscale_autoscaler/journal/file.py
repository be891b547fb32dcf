"""The journal in a file under `stateDir`: for a single replica, whose restarted process
finds it where the last one left it (the chart mounts a volume there, so a container restart
keeps it). The directory is created on the first write if missing.

Without `stateDir` (and without a Kubernetes namespace for a ConfigMap) the file lives in a
default place, so that a restart never doubles a scale-up in any way the provider is run:
systemd's `$STATE_DIRECTORY` (StateDirectory=), else `$XDG_STATE_HOME/cloudscale-autoscaler`,
else `~/.local/state/cloudscale-autoscaler` (the XDG default). The image sets
`STATE_DIRECTORY`.

A write goes to a temporary file in the same directory, is flushed to disk, and replaces the
record by rename: a crash leaves the old record or the new one, never half of one.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cloudscale_autoscaler.journal.store import JournalError, Stored

FILE_NAME = "creations.json"
APP_DIRECTORY = "cloudscale-autoscaler"


def default_directory(env: Mapping[str, str]) -> tuple[Path, str]:
    """Where the journal lives without stateDir, and which rule chose it (for the log)."""
    systemd = env.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd), "$STATE_DIRECTORY; stateDir chooses another place"
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg:
        return Path(xdg) / APP_DIRECTORY, "$XDG_STATE_HOME; stateDir chooses another place"
    home = Path(env.get("HOME") or Path.home())
    where = home / ".local" / "state" / APP_DIRECTORY
    return where, "the default place; stateDir chooses another"


class FileStore:
    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self.where = f"file {self.path}"

    async def read(self) -> Stored:
        return await asyncio.to_thread(self._read)

    async def write(self, text: str, version: str | None) -> str | None:
        await asyncio.to_thread(self._write, text)
        return None

    def _read(self) -> Stored:
        try:
            return Stored(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Stored(None)
        except UnicodeDecodeError:
            return Stored("")  # not text: decode() reports it as unreadable
        except OSError as exc:
            raise JournalError(f"cannot read {self.where}: {exc.strerror or exc}") from None

    def _write(self, text: str) -> None:
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=".creations-", dir=directory)
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    out.write(text)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, self.path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
            _sync_directory(directory)  # the rename itself survives a crash
        except OSError as exc:
            raise JournalError(f"cannot write {self.where}: {exc.strerror or exc}") from None


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
