"""The journal's one writer: claims the record, then keeps it equal to the creates in flight.

- `claim()` reads the record, reports what cannot be read (a clear log line, never a crash),
  and writes it back naming this replica as holder. A store that compares versions then
  refuses any later write of a replica that held the record before: a leader that lost its
  Lease and wakes up late cannot record (hence cannot send) creates behind the new leader. A
  record that could not be read whole (or a ConfigMap found deleted) may have held creates
  still being carried out: the claim says so (`Claim.doubt`), and the inventory holds
  scale-ups for the adoption bound. The doubt is written into the record (`doubt`) from the
  claim on, until the inventory's hold ends, so a holder that dies during its hold passes it
  on: its successor reads a whole record, but one without the creates the lost record held.
- `persist()` writes the current snapshot (the engine's creates not yet confirmed) and returns
  once a write that began after the call succeeded, or at once when our last write already
  holds that snapshot: a batch of creates is sent only after it. Concurrent callers share
  writes.
- `touch()` asks for a write some time soon: a create confirmed, failed or cancelled leaves
  the record stale, which is safe (its request tag is listed, or the entry waits out its
  bound) but not tidy.
- `fence` (leader election: whether this replica holds the Lease) is asked before every write,
  the claim's included: a replica that lost the Lease while its claim or a write was under way
  never writes the record again, so it cannot take it back from the new leader.
- A record deleted while held (a ConfigMap deleted by hand) is written anew on the next write;
  where the account may not create it, the error says what to create.

Runs on the asyncio loop; writes happen one at a time, in the writer task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from cloudscale_autoscaler.journal.entries import Entry, decode, encode
from cloudscale_autoscaler.journal.store import Conflict, Gone, JournalError, JournalStore, Stored

log = logging.getLogger(__name__)

# Reads and writes of a claim racing another writer before giving up.
CLAIM_ATTEMPTS = 3
# How long a touch() waits for more changes before writing them together.
DEBOUNCE_SECONDS = 0.5

# None while this replica may write the record, else why not.
Fence = Callable[[], str | None]


@dataclass(frozen=True)
class Claim:
    """What a claim found: the entries an earlier holder left, and, when the record could not
    be read whole (or was deleted), why creates it held may be unknown."""

    entries: list[Entry]
    doubt: str | None = None


def unfenced() -> str | None:
    return None


class Journal:
    def __init__(
        self,
        store: JournalStore,
        cluster: str,
        holder: str,
        snapshot: Callable[[], list[Entry]],
        debounce_seconds: float = DEBOUNCE_SECONDS,
        fence: Fence = unfenced,
    ) -> None:
        self._store = store
        self._fence = fence
        self._cluster = cluster
        self.holder = holder
        self._snapshot = snapshot
        self._debounce = debounce_seconds
        self._claimed = False
        self._version: str | None = None
        self._text: str | None = None  # what the record holds, as we last wrote it
        self._requested = 0  # persist() calls so far
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        # Set by persist(): a batch waits to be sent, so a touch's debounce ends at once.
        self._urgent = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Why scale-ups are held, written into every record while set (entries.py, `doubt`).
        self.doubt: str | None = None

    @property
    def where(self) -> str:
        return self._store.where

    # --- claiming -------------------------------------------------------------------------

    async def claim(self) -> Claim:
        """Make the record ours; what an earlier holder left in it. JournalError when the
        store cannot be read or written."""
        for _ in range(CLAIM_ATTEMPTS):
            stored = await self._store.read()
            left, doubt = self._readable(stored)
            if doubt is not None:
                self.doubt = doubt
            mine = self._snapshot()
            known = {entry.request for entry in mine}
            kept = mine + [entry for entry in left if entry.request not in known]
            text = encode(self._cluster, self.holder, kept, self.doubt)
            self._check_fence()
            try:
                self._version = await self._store.write(text, stored.version)
            except Conflict:
                continue
            self._text, self._claimed = text, True
            return Claim(left, doubt)
        raise JournalError(f"{self.where} kept changing while it was claimed: another writer?")

    @property
    def claimed(self) -> bool:
        return self._claimed

    def forget(self) -> None:
        """No longer ours (leadership lost): the next claim reads it again."""
        self._claimed = False

    def _check_fence(self) -> None:
        refusal = self._fence()
        if refusal is not None:
            self._claimed = False
            raise JournalError(f"{self.where} not written: {refusal}")

    def _readable(self, stored: Stored) -> tuple[list[Entry], str | None]:
        """The entries that could be read, and why there may have been more."""
        if stored.text is None:
            return [], f"{self.where} was deleted" if stored.missing else None
        decoded = decode(stored.text, self._cluster)
        for problem in decoded.problems:
            log.error(
                "creation journal %s: %s; creates it may have held are not known, so no "
                "scale-up is made until they would have been listed",
                self.where,
                problem,
            )
        if decoded.doubt is not None:  # passed on as it is, however many holders it outlives
            log.error(
                "creation journal %s: its holder was holding scale-ups and did not live to "
                "end it (%s); creates a holder before it sent are not known, so no scale-up "
                "is made until they would have been listed",
                self.where,
                decoded.doubt,
            )
        problems = [*decoded.problems, *([] if decoded.doubt is None else [decoded.doubt])]
        return decoded.entries, "; ".join(problems) or None

    # --- writing --------------------------------------------------------------------------

    async def persist(self) -> None:
        """The creates in flight now are on record when this returns; JournalError if not."""
        if not self._claimed:
            raise JournalError(f"{self.where} is not claimed by this replica (not leading)")
        self._requested += 1
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._requested, done))
        self._urgent.set()
        self._start()
        await asyncio.shield(done)

    def touch(self) -> None:
        if self._claimed:
            self._start()

    def _start(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if not self._waiters:  # a touch: let more changes gather, unless a batch waits
                    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that
                    # comes as the event is set, and the writer would then never stop.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._debounce):
                            await self._urgent.wait()
                self._urgent.clear()
                covered = self._requested
                try:
                    await self._write()
                    error: JournalError | None = None
                except JournalError as exc:
                    error = exc
                    if not self._waiters:
                        log.warning("creation journal: %s", exc)
                self._settle(covered, error)
        finally:  # stopped (shutdown): nobody may wait for a write that will not come
            self._settle(self._requested, JournalError(f"{self.where}: writer stopped"))

    def _settle(self, covered: int, error: JournalError | None) -> None:
        still = []
        for number, done in self._waiters:
            if number > covered:
                still.append((number, done))
            elif done.done():
                continue
            elif error is not None:
                done.set_exception(error)
                done.exception()  # retrieved: a caller cancelled meanwhile waits no more
            else:
                done.set_result(None)
        self._waiters = still

    async def _write(self) -> None:
        if not self._claimed:
            if self._waiters:
                raise JournalError(f"{self.where} is not claimed by this replica (not leading)")
            return  # a touch after the record was lost: nothing of ours to write
        text = encode(self._cluster, self.holder, self._snapshot(), self.doubt)
        if text == self._text:
            return
        self._check_fence()
        try:
            self._version = await self._store.write(text, self._version)
        except Conflict:
            await self._recover_version()
            self._check_fence()
            self._version = await self._store.write(text, self._version)
        except Gone:
            log.error("creation journal %s was deleted while held: writing it anew", self.where)
            self._version = None  # create it; until that succeeds, every write tries again
            self._check_fence()
            self._version = await self._store.write(text, None)
        self._text = text

    async def _recover_version(self) -> None:
        """After a conflict: still ours (an edit by hand, or our own write whose answer was
        lost), or damaged past reading (no holder: overwritten by hand, another cluster's), means
        write again over it, as the claim would; another holder means this replica lost the
        record. Writes are fenced by the Lease, so no other replica can be holding it then."""
        stored = await self._store.read()
        holder = self._readable_holder(stored)
        if holder and holder != self.holder:
            self._claimed = False
            raise JournalError(
                f"{self.where} is now held by {holder}: this replica no longer records (nor "
                "sends) creates"
            )
        self._version = stored.version

    def _readable_holder(self, stored: Stored) -> str:
        decoded = decode(stored.text or "", self._cluster)
        if not decoded.holder:
            for problem in decoded.problems:
                log.error("creation journal %s: %s; writing it over", self.where, problem)
        return decoded.holder

    async def aclose(self, grace_seconds: float = 2.0) -> None:
        """A last write of what is in flight (shutdown), then stop the writer."""
        if self._claimed and self._task is not None:
            with contextlib.suppress(JournalError, TimeoutError):
                await asyncio.wait_for(self.persist(), grace_seconds)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
