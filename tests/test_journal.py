"""The creation journal's record format (a table of what can be read and what not) and its
writer over the file store: claiming, writing before the creates go out, coalescing, and a
record that another writer took.

The journal's effect on a running provider (restarts, CA) is tested in
tests/test_journal_restart.py, tests/test_kube_leader.py and tests/test_ca_real.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudscale_autoscaler.journal.entries import Entry, decode, encode
from cloudscale_autoscaler.journal.file import FILE_NAME, FileStore, default_directory
from cloudscale_autoscaler.journal.store import Conflict, Gone, JournalError, Stored
from cloudscale_autoscaler.journal.writer import Journal

CLUSTER = "prod"
ONE = Entry("9f2c0000aabbccdd", "workers", "prod-workers-ab12cd34", "2026-11-27T10:00:00Z")
GOOD = {"request": "9f2c0000aabbccdd", "group": "workers", "name": "prod-workers-ab12cd34",
        "at": "2026-11-27T10:00:00Z"}  # fmt: skip


def record(**fields: object) -> str:
    body = {"format": 1, "cluster": CLUSTER, "holder": "pod-a", "creations": [GOOD], **fields}
    return json.dumps(body)


@pytest.mark.parametrize(
    ("text", "entries", "problem"),
    [
        (record(), [ONE], None),
        (record(creations=[]), [], None),
        (record()[:-30], [], "not JSON"),
        ("", [], "not JSON"),
        ("[1, 2]", [], "expected a JSON object, got list"),
        (record(format=2), [], "format 2 is not 1"),
        (record(cluster="staging"), [], "written for cluster 'staging', not 'prod': foreign"),
        (record(creations={"a": 1}), [], "`creations` is not a list"),
        (record(creations=[GOOD, {**GOOD, "group": 3}]), [ONE], "creations[1]: expected"),
        (record(creations=[{**GOOD, "at": ""}, GOOD]), [ONE], "creations[0]: expected"),
        (record(creations=["x"]), [], "creations[0]: expected"),
    ],
    ids=["one", "empty", "truncated", "blank", "list", "format", "foreign", "not-a-list",
         "bad-type", "empty-field", "not-a-mapping"],
)  # fmt: skip
def test_decode(text: str, entries: list[Entry], problem: str | None) -> None:
    decoded = decode(text, CLUSTER)
    assert decoded.entries == entries
    if problem is None:
        assert decoded.problems == []
        assert decoded.holder == "pod-a"
    else:
        assert len(decoded.problems) == 1 and problem in decoded.problems[0], decoded.problems


def test_encode_is_what_decode_reads() -> None:
    text = encode(CLUSTER, "pod-b", [ONE, ONE])
    decoded = decode(text, CLUSTER)
    assert (decoded.holder, decoded.entries, decoded.problems) == ("pod-b", [ONE, ONE], [])


class Counting(FileStore):
    """The file store, counting its writes."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.writes = 0

    async def write(self, text: str, version: str | None) -> str | None:
        self.writes += 1
        return await super().write(text, version)


async def test_a_claim_reads_what_the_last_holder_left_and_makes_the_record_ours(
    tmp_path: Path,
) -> None:
    first = Journal(FileStore(tmp_path), CLUSTER, "pid 1", lambda: [ONE])
    assert (await first.claim()).entries == []  # no record yet: nothing left
    await first.persist()
    second = Journal(FileStore(tmp_path), CLUSTER, "pid 2", list)
    assert (await second.claim()).entries == [ONE]
    decoded = decode((tmp_path / FILE_NAME).read_text(), CLUSTER)
    # Kept until the next holder's snapshot no longer lists it: a third process still sees it.
    assert (decoded.holder, decoded.entries) == ("pid 2", [ONE])


async def test_a_bad_record_is_logged_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / FILE_NAME).write_text('{"format":1,"cluster":"prod","creations":[{"requ')
    journal = Journal(FileStore(tmp_path), CLUSTER, "pid 1", list)
    assert (await journal.claim()).entries == []
    [line] = [r.getMessage() for r in caplog.records if "creation journal" in r.getMessage()]
    assert str(tmp_path / FILE_NAME) in line and "not JSON" in line
    assert decode((tmp_path / FILE_NAME).read_text(), CLUSTER).problems == []


async def test_persist_writes_what_is_in_flight_and_concurrent_callers_share_writes(
    tmp_path: Path,
) -> None:
    in_flight: list[Entry] = []
    store = Counting(tmp_path)
    journal = Journal(store, CLUSTER, "pid 1", lambda: list(in_flight))
    await journal.claim()
    claimed = store.writes
    in_flight.append(ONE)
    await asyncio.gather(*(journal.persist() for _ in range(20)))
    assert decode((tmp_path / FILE_NAME).read_text(), CLUSTER).entries == [ONE]
    assert store.writes - claimed <= 2, "20 batches at once share their writes"
    in_flight.clear()
    journal.touch()  # a create confirmed: written a little later, with others
    await asyncio.sleep(1.0)
    assert decode((tmp_path / FILE_NAME).read_text(), CLUSTER).entries == []
    await journal.aclose()


async def test_nothing_is_written_before_a_claim(tmp_path: Path) -> None:
    journal = Journal(FileStore(tmp_path), CLUSTER, "pid 1", lambda: [ONE])
    with pytest.raises(JournalError, match="not claimed"):
        await journal.persist()
    assert not (tmp_path / FILE_NAME).exists()


class Versioned:
    """A store that compares versions, as the ConfigMap store does (tests/test_kube_journal.py
    runs the real one against a kube-apiserver): None is the version of a record that does not
    exist, and writing with it creates one."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.version: int | None = None
        self.where = "memory"
        # Called after each read, before the reader goes on (a rival acting in between).
        self.after_read: list[Callable[[], Awaitable[None]]] = []

    async def read(self) -> Stored:
        stored = Stored(self.text, None if self.version is None else str(self.version))
        while self.after_read:
            await self.after_read.pop(0)()
        return stored

    async def write(self, text: str, version: str | None) -> str | None:
        current = None if self.version is None else str(self.version)
        if version is not None and current is None:
            raise Gone("deleted")
        if version != current:
            raise Conflict("changed")
        self.text, self.version = text, (self.version or 0) + 1
        return str(self.version)

    def delete(self) -> None:
        self.text = self.version = None


async def test_a_replica_whose_record_was_taken_records_nothing_more() -> None:
    """Its next batch is refused (so never sent); what it recorded before, the new holder read."""
    store = Versioned()
    in_flight = [ONE]
    old = Journal(store, CLUSTER, "pod-a", lambda: list(in_flight))
    await old.claim()
    await old.persist()
    new = Journal(store, CLUSTER, "pod-b", list)
    assert (await new.claim()).entries == [ONE]
    in_flight.append(Entry("77770000aabbccdd", "workers", "prod-workers-zz", ONE.at))
    with pytest.raises(JournalError, match="now held by pod-b"):
        await old.persist()
    assert not old.claimed
    assert decode(store.text or "", CLUSTER).holder == "pod-b"


async def test_a_conflict_with_our_own_record_is_written_over() -> None:
    """An edit by hand (or our own write whose answer was lost) leaves the record ours."""
    store = Versioned()
    journal = Journal(store, CLUSTER, "pod-a", lambda: [ONE])
    await journal.claim()
    store.version = (store.version or 0) + 1  # someone else's write; the holder is still pod-a
    await journal.persist()
    assert decode(store.text or "", CLUSTER).entries == [ONE]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"STATE_DIRECTORY": "/var/lib/cas:/var/lib/other", "XDG_STATE_HOME": "/x",
          "HOME": "/home/u"}, "/var/lib/cas"),
        ({"XDG_STATE_HOME": "/x/state", "HOME": "/home/u"}, "/x/state/cloudscale-autoscaler"),
        ({"STATE_DIRECTORY": "", "HOME": "/home/u"},
         "/home/u/.local/state/cloudscale-autoscaler"),
    ],
    ids=["systemd", "xdg", "home"],
)  # fmt: skip
def test_the_default_place_of_the_journal(env: dict[str, str], expected: str) -> None:
    """Without stateDir (and without a ConfigMap) the journal still has a place: a restart
    during a scale-up must not double it in any way the provider is run."""
    directory, why = default_directory(env)
    assert str(directory) == expected
    assert "stateDir" in why


DEEP = "[" * 100_000
NESTED_ENTRY = record(creations=[json.loads("[" * 900 + "]" * 900)])


@pytest.mark.parametrize(
    "text",
    [DEEP, '{"format": 1, "cluster": "prod", "creations": ' + DEEP, NESTED_ENTRY,
     record(format=json.loads("[" * 900 + "]" * 900)), "\ud800", "1e999",
     '{"format": 1e999}', "-" * 10_000],
    ids=["deep", "deep-creations", "deep-entry", "deep-format", "surrogate",
         "huge-number", "huge-format", "dashes"],
)  # fmt: skip
def test_decode_of_crafted_records_never_raises(text: str) -> None:
    """A damaged or crafted record is reported, never raised: a raise here failed every
    Refresh on every replica until someone edited the record by hand."""
    decoded = decode(text, CLUSTER)
    assert decoded.entries == [] and decoded.problems, decoded


@settings(max_examples=300, deadline=None)
@given(st.text() | st.binary().map(lambda raw: raw.decode("utf-8", "replace")))
def test_decode_of_any_text_never_raises(text: str) -> None:
    """Whatever it reads back, written again, reads back the same."""
    decoded = decode(text, CLUSTER)
    again = decode(encode(CLUSTER, decoded.holder, decoded.entries), CLUSTER)
    assert (again.holder, again.entries, again.problems) == (decoded.holder, decoded.entries, [])


async def test_a_record_deleted_while_held_is_written_anew() -> None:
    """Deleted by hand (kubectl delete configmap): the next write makes it again, rather than
    every write failing with "not found" until the provider restarts."""
    store = Versioned()
    in_flight: list[Entry] = []
    journal = Journal(store, CLUSTER, "pod-a", lambda: list(in_flight))
    await journal.claim()
    store.delete()
    in_flight.append(ONE)
    await journal.persist()
    decoded = decode(store.text or "", CLUSTER)
    assert (decoded.holder, decoded.entries) == ("pod-a", [ONE])


async def test_a_claim_of_a_replica_that_lost_the_lease_meanwhile_writes_nothing() -> None:
    """Replica A reads the record to claim it; meanwhile its Lease lapses and B claims. A's
    write conflicts, and its claim must not read again and take the record back from B."""
    store = Versioned()
    leading = {"pod-a": True}
    old = Journal(store, CLUSTER, "pod-a", list, fence=lambda: None if leading["pod-a"] else "no")
    new = Journal(store, CLUSTER, "pod-b", list)

    async def lease_moves_to_b() -> None:
        leading["pod-a"] = False
        await new.claim()

    store.after_read.append(lease_moves_to_b)
    with pytest.raises(JournalError, match="not written: no"):
        await old.claim()
    assert not old.claimed
    assert decode(store.text or "", CLUSTER).holder == "pod-b"
    assert new.claimed


async def test_a_batch_is_written_at_once_even_during_a_touchs_debounce() -> None:
    """A Refresh touches the journal (confirmed creates to drop) and CA's IncreaseSize
    follows at once: its batch waited out the touch's debounce (0.5 s) before any create was
    sent, so IncreaseSize's verdict never saw one (found by the seams campaign)."""
    store = Versioned()
    in_flight: list[Entry] = []
    journal = Journal(store, CLUSTER, "pod-a", lambda: list(in_flight), debounce_seconds=60.0)
    await journal.claim()
    journal.touch()
    await asyncio.sleep(0)  # the writer is in its debounce now
    in_flight.append(ONE)
    await asyncio.wait_for(journal.persist(), 5.0)
    assert decode(store.text or "", CLUSTER).entries == [ONE]
    await journal.aclose()


@pytest.mark.parametrize(
    "damage",
    ["}{ not json", "[" * 50_000, encode("elsewhere", "x", []), encode(CLUSTER, "", [])],
    ids=["garbage", "deep", "foreign-cluster", "no-holder"],
)
async def test_a_record_damaged_while_held_is_written_over(damage: str) -> None:
    """Overwritten by hand while held: no other replica holds it, so it is ours still. The
    holder took it for lost ("held by nobody") and refused every batch until the next Refresh
    claimed it again (found by the seams campaign)."""
    store = Versioned()
    in_flight: list[Entry] = []
    journal = Journal(store, CLUSTER, "pod-a", lambda: list(in_flight))
    await journal.claim()
    store.text, store.version = damage, (store.version or 0) + 1
    in_flight.append(ONE)
    await journal.persist()
    decoded = decode(store.text or "", CLUSTER)
    assert (decoded.holder, decoded.entries) == ("pod-a", [ONE])
    assert journal.claimed


async def test_the_writer_stops_when_cancelled_as_a_batch_wakes_it() -> None:
    """Cancelled (its replica killed or shutting down) in the loop turn in which a batch ends
    its debounce: with 3.11's wait_for the cancel was swallowed, the writer went back to
    waiting, and whoever cancelled it waited for ever (found by the seams campaign)."""
    store = Versioned()
    journal = Journal(store, CLUSTER, "pod-a", lambda: [ONE], debounce_seconds=60.0)
    await journal.claim()
    journal.touch()
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the writer waits in its debounce now
    (writer,) = [t for t in asyncio.all_tasks() if "Journal._run" in repr(t.get_coro())]
    batch = asyncio.ensure_future(journal.persist())
    await asyncio.sleep(0)  # the batch has woken the debounce's wait
    writer.cancel()
    await asyncio.wait_for(asyncio.gather(writer, return_exceptions=True), 5.0)
    assert writer.cancelled()
    batch.cancel()


@pytest.mark.parametrize(
    ("doubt", "read"),
    [("not JSON (...)", "not JSON (...)"), ("", "''"), (7, "7"), (None, None)],
    ids=["text", "empty", "number", "absent"],
)
def test_a_holders_doubt_is_read_whatever_it_wrote(doubt: object, read: str | None) -> None:
    text = record() if doubt is None else record(doubt=doubt)
    decoded = decode(text, CLUSTER)
    assert (decoded.doubt, decoded.entries, decoded.problems) == (read, [ONE], [])


async def test_a_doubt_is_passed_on_until_the_hold_ends(tmp_path: Path) -> None:
    """A claim of garbage doubts; its record says so from the claim on, so a successor that
    finds a whole record still doubts (and holds scale-ups); once the hold ends (doubt
    cleared) the record stops saying so, and the next claim doubts nothing."""
    (tmp_path / FILE_NAME).write_text("garbage")
    first = Journal(FileStore(tmp_path), CLUSTER, "pid 1", lambda: [ONE])
    doubt = (await first.claim()).doubt
    assert doubt is not None and "not JSON" in doubt
    assert decode((tmp_path / FILE_NAME).read_text(), CLUSTER).doubt == doubt
    second = Journal(FileStore(tmp_path), CLUSTER, "pid 2", list)
    passed_on = await second.claim()  # the first died during its hold
    assert (passed_on.entries, passed_on.doubt) == ([ONE], doubt)
    second.doubt = None  # the inventory's hold ended
    await second.persist()
    third = Journal(FileStore(tmp_path), CLUSTER, "pid 3", list)
    assert (await third.claim()).doubt is None
