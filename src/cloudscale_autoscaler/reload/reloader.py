"""Reloading the config file while serving.

- **Noticing a change.** Every CHECK_SECONDS the file is read and its content compared with
  the running configuration's: a mounted ConfigMap is replaced by an atomic symlink swap that a
  modification time need not show, while its content always does. SIGHUP (`request`) forces a
  read and an attempt, even of unchanged content.
- **Validating it** as `check-config --online` does: the loader's checks (every error with its
  path), then no change to what a reload cannot change (reload/fixed.py), then the flavors,
  images, zones and networks against the API. Any problem refuses the reload, whole: the
  running configuration stays, each problem is logged as `check-config` prints it, and the
  status says so until a later file is applied. When the API cannot be asked, the attempt is
  repeated at the next check.
- **Applying it** (`apply`, the app's) between calls: the engine takes it in one synchronous
  stretch, then the transport's prepared answers are published again; `apply` either applies
  it whole or raises with the running configuration back in place.
- **Never ending.** Whatever goes wrong in an attempt (a bug included) refuses that attempt:
  logged, counted (`counts`), in the status, and the next change or SIGHUP is tried as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.reload.fixed import fixed_changes
from cloudscale_autoscaler.settings.types import Config, ConfigError

log = logging.getLogger(__name__)

CHECK_SECONDS = 2.0

# The config's names against the API: problems found (raises CloudError when it cannot ask).
OnlineCheck = Callable[[Config], Awaitable[list[str]]]
# Serves the new config, whole, or raises having kept the running one.
Apply = Callable[[Config], Awaitable[None]]
# How reload attempts ended: applied; refused (the file's content); failed (something else).
OUTCOMES = ("applied", "refused", "failed")


@dataclass(frozen=True)
class ConfigFile:
    """The file `serve` loads its config from, with its content's digest read before loading:
    a change made while the provider starts (which waits for the first listing) then differs
    from it and is applied once serving, instead of being taken for the running config."""

    path: Path
    digest: bytes | None

    @classmethod
    def before_loading(cls, path: Path) -> ConfigFile:
        return cls(path, file_digest(path))


@dataclass(frozen=True)
class ReloadStatus:
    """What `serve` runs with, and how the last reload went (for /status and the metrics)."""

    path: str
    loaded_unix: float  # when the running configuration was loaded: at start, or a reload
    attempt_unix: float | None = None  # the last reload tried; None: none yet
    ok: bool | None = None  # how it went; None: none yet
    errors: tuple[str, ...] = ()  # why it was refused, `<path>: <reason>` each


class Reloader:
    def __init__(
        self,
        file: ConfigFile,
        running: Config,
        online_check: OnlineCheck,
        apply: Apply,
        check_seconds: float = CHECK_SECONDS,
    ) -> None:
        self._path = file.path
        self._running = running
        self._online_check = online_check
        self._apply = apply
        self._check_seconds = check_seconds
        self._digest = file.digest
        self._forced = asyncio.Event()
        self._again = False  # the last attempt could not be finished: try the same file again
        self.status = ReloadStatus(str(file.path), time.time())
        self.on_refused: list[Callable[[list[str]], None]] = []
        self.counts = dict.fromkeys(OUTCOMES, 0)

    def request(self) -> None:
        """Read the file now and reload it even if unchanged (SIGHUP)."""
        self._forced.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._check_seconds):
                    await self._forced.wait()
            forced = self._forced.is_set()
            self._forced.clear()
            try:
                await self.check(forced)
            except Exception as error:  # a bug: this attempt fails, reloading goes on
                log.exception("config reload: %s: the attempt failed", self._path)
                self._refused([f"the reload failed: {error!r}"], "failed")

    async def check(self, forced: bool = False) -> None:
        """Reload the file if its content changed (or `forced`, or the last try was cut short)."""
        digest = await asyncio.to_thread(file_digest, self._path)
        if digest is None:
            return  # between a ConfigMap swap's steps, or removed: the running config stays
        if digest == self._digest and not forced and not self._again:
            return
        self._digest, self._again = digest, False
        log.info("config reload: %s %s, reading it", self._path,
                 "asked for (SIGHUP)" if forced else "changed")  # fmt: skip
        try:
            config, errors = await self._validated()
        except CloudError as error:
            self._again = True
            self._refused([f"could not check the config against the API ({error}); trying "
                           f"again in {self._check_seconds:g}s"], "failed")  # fmt: skip
            return
        if errors or config is None:
            self._refused(errors, "refused")
            return
        try:
            await self._apply(config)
        except Exception as error:
            log.exception("config reload: applying %s failed", self._path)
            self._refused([f"applying it failed ({error!r}): nothing of it was applied"],
                          "failed")  # fmt: skip
            return
        self._running = config
        now = time.time()
        self.status = ReloadStatus(str(self._path), now, now, True)
        self.counts["applied"] += 1
        log.info("config reload: %s applied (node groups: %s)", self._path,
                 ", ".join(g.name for g in config.node_groups))  # fmt: skip

    async def _validated(self) -> tuple[Config | None, list[str]]:
        try:
            config = await asyncio.to_thread(load_config, self._path)
        except ConfigError as error:
            return None, list(error.errors)
        problems = fixed_changes(self._running, config)
        if problems:
            return None, problems
        return config, await self._online_check(config)

    def _refused(self, errors: list[str], outcome: str) -> None:
        self.counts[outcome] += 1
        self.status = ReloadStatus(
            str(self._path), self.status.loaded_unix, time.time(), False, tuple(errors)
        )
        log.error("config reload: %s refused, the running configuration is kept:", self._path)
        for error in errors:
            log.error("config reload: %s: %s", self._path, error)
        for listener in self.on_refused:
            try:
                listener(errors)
            except Exception:  # an Event that cannot be queued must not end reloading
                log.exception("config reload: reporting the refusal failed")


def file_digest(path: Path) -> bytes | None:
    """The content's digest; None for what is not a regular file (a FIFO would block the
    read until a writer came: the loader refuses it, naming it) or cannot be read."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None
