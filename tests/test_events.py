"""Kubernetes Event aggregation (kube/events.py) and which cloud errors become Events: pure,
table-driven. The writes themselves are tested against a real kube-apiserver in
test_kube_events.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CapacityError,
    CloudError,
    InvalidRequestError,
    NotFoundError,
    QuotaExceededError,
    RateLimitedError,
    UnavailableError,
)
from cloudscale_autoscaler.kube.events import (
    MESSAGE_LIMIT,
    REPEAT_SECONDS,
    WARNING,
    Aggregator,
    Regarding,
    Tally,
    event_name,
    new_event,
)
from cloudscale_autoscaler.kube.recorder import refusal_message

POD = Regarding("Pod", "provider-0", "kube-system", "pod-uid")
OTHER_POD = Regarding("Pod", "provider-1", "kube-system", "other-uid")
NODE = Regarding("Node", "worker-1", uid="worker-1")


@dataclass(frozen=True)
class Occurrence:
    regarding: Regarding
    reason: str
    message: str
    same: str | None = None


def storm(count: int, message: str = "quota") -> list[Occurrence]:
    return [Occurrence(POD, "CreationRefused", message)] * count


def drain(aggregator: Aggregator, now: float = 0) -> list[tuple[str, str, str, int]]:
    """(object, reason, message, count) of each Event created at `now`, in order, until
    nothing due waits."""
    writes = []
    while (write := aggregator.take(now)) is not None:
        event = write.event
        writes.append((event.regarding.name, event.reason, event.message, event.count))
        aggregator.written(write, now)
    return writes


AGGREGATION = [
    pytest.param(storm(1000), [("provider-0", "CreationRefused", "quota", 1000)], id="storm"),
    pytest.param(
        [*storm(2, "quota"), *storm(3, "capacity")],
        [
            ("provider-0", "CreationRefused", "quota", 2),
            ("provider-0", "CreationRefused", "capacity", 3),
        ],
        id="other-message-other-event",
    ),
    pytest.param(
        [Occurrence(POD, "CreationRefused", "x"), Occurrence(POD, "DeletionFailed", "x")],
        [("provider-0", "CreationRefused", "x", 1), ("provider-0", "DeletionFailed", "x", 1)],
        id="other-reason-other-event",
    ),
    pytest.param(
        [Occurrence(POD, "LeadershipLost", "x"), Occurrence(OTHER_POD, "LeadershipLost", "x")],
        [("provider-0", "LeadershipLost", "x", 1), ("provider-1", "LeadershipLost", "x", 1)],
        id="other-object-other-event",
    ),
    pytest.param(
        [
            Occurrence(NODE, "DeletionFailed", "first text", same="workers/uuid"),
            Occurrence(NODE, "DeletionFailed", "second text", same="workers/uuid"),
        ],
        [("worker-1", "DeletionFailed", "second text", 2)],
        id="same-key-latest-message",
    ),
    pytest.param(
        [Occurrence(POD, "TemplateDrift", "x" * (MESSAGE_LIMIT + 10))],
        [("provider-0", "TemplateDrift", "x" * MESSAGE_LIMIT, 1)],
        id="message-clipped-to-the-api-limit",
    ),
]


@pytest.mark.parametrize(("occurrences", "expected"), AGGREGATION)
def test_occurrences_aggregate_into_events(
    occurrences: list[Occurrence], expected: list[tuple[str, str, str, int]]
) -> None:
    aggregator = Aggregator()
    for now, occurrence in enumerate(occurrences):
        aggregator.record(
            occurrence.regarding, WARNING, occurrence.reason, occurrence.message, now,
            occurrence.same,
        )  # fmt: skip
    assert drain(aggregator) == expected
    assert aggregator.dropped == 0


def test_repeats_after_an_event_wait_for_the_keys_next_event_and_count_from_it() -> None:
    """Events are only created, never patched: occurrences after a key's Event go into its
    next Event, due REPEAT_SECONDS after the last one, with the count since."""
    aggregator = Aggregator()
    for now in range(3):
        aggregator.record(POD, WARNING, "CreationRefused", "quota", now)
    first = aggregator.take(3)
    assert first is not None and first.event.count == 3
    # Meanwhile (the create is out): two more.
    aggregator.record(POD, WARNING, "CreationRefused", "quota", 4)
    aggregator.record(POD, WARNING, "CreationRefused", "quota", 5)
    assert first.event.count == 3, "what was taken is a copy"
    aggregator.written(first, 5)
    assert aggregator.take(5 + REPEAT_SECONDS - 1) is None, "not due yet"
    assert aggregator.next_due(5 + REPEAT_SECONDS - 1) == 1
    second = aggregator.take(5 + REPEAT_SECONDS)
    assert second is not None and second.key == first.key
    assert (second.event.count, second.event.first, second.event.last) == (2, 4, 5)
    assert aggregator.take(100) is None and aggregator.next_due(100) is None


def test_a_failed_create_counts_its_occurrences_into_the_next_event() -> None:
    aggregator = Aggregator()
    aggregator.record(POD, WARNING, "CreationRefused", "quota", 0)
    write = aggregator.take(0)
    assert write is not None
    aggregator.failed(write)  # the API server refused it
    aggregator.record(POD, WARNING, "CreationRefused", "quota", 1)
    again = aggregator.take(1)
    assert again is not None and (again.event.count, again.event.first) == (2, 0)


QUEUE = [
    pytest.param(3, 3, [], 0, id="fits"),
    pytest.param(3, 5, ["m0", "m1"], 2, id="oldest-dropped"),
    pytest.param(1, 4, ["m0", "m1", "m2"], 3, id="one-slot"),
]


@pytest.mark.parametrize(("limit", "keys", "lost", "dropped"), QUEUE)
def test_a_full_queue_drops_its_oldest_key_and_counts_it(
    limit: int, keys: int, lost: list[str], dropped: int
) -> None:
    aggregator = Aggregator(queue_limit=limit)
    for index in range(keys):
        aggregator.record(POD, WARNING, "TemplateDrift", f"m{index}", index)
    written = [message for _, _, message, _ in drain(aggregator)]
    assert written == [f"m{i}" for i in range(keys) if f"m{i}" not in lost]
    assert aggregator.dropped == dropped
    # A dropped key's tally stays: its next occurrence writes the total.
    if lost:
        aggregator.record(POD, WARNING, "TemplateDrift", lost[0], 99)
        assert drain(aggregator) == [("provider-0", "TemplateDrift", lost[0], 2)]


def test_tallies_beyond_the_limit_forget_the_least_recently_seen_not_the_waiting() -> None:
    aggregator = Aggregator(tally_limit=2)
    aggregator.record(POD, WARNING, "TemplateDrift", "a", 0)
    aggregator.record(POD, WARNING, "TemplateDrift", "b", 1)
    assert len(drain(aggregator)) == 2
    aggregator.record(POD, WARNING, "TemplateDrift", "a", 2)  # "b" is now the oldest seen
    aggregator.record(POD, WARNING, "TemplateDrift", "c", 3)  # evicts "b", not the waiting
    aggregator.record(POD, WARNING, "TemplateDrift", "b", 4)
    assert drain(aggregator, 4) == [
        ("provider-0", "TemplateDrift", "c", 1),
        # Forgotten, with when its last Event was: a new Event at once.
        ("provider-0", "TemplateDrift", "b", 1),
    ]
    assert drain(aggregator, REPEAT_SECONDS) == [("provider-0", "TemplateDrift", "a", 1)]


def tally(regarding: Regarding) -> Tally:
    return Tally(regarding, WARNING, "DeletionFailed", "text", 7, 1_700_000_000.4, 1_700_000_060)


BODIES = [
    pytest.param(
        POD,
        "kube-system",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "provider-0",
            "namespace": "kube-system",
            "uid": "pod-uid",
        },
        id="pod-in-its-namespace",
    ),
    pytest.param(
        NODE,
        "default",
        {"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": "worker-1"},
        id="node-in-default",
    ),
    pytest.param(
        Regarding("Pod", "provider-0", "ns"),
        "ns",
        {"apiVersion": "v1", "kind": "Pod", "name": "provider-0", "namespace": "ns"},
        id="pod-without-uid",
    ),
]


@pytest.mark.parametrize(("regarding", "namespace", "reference"), BODIES)
def test_event_bodies(regarding: Regarding, namespace: str, reference: dict[str, str]) -> None:
    body = new_event(tally(regarding), "the-name", "x" * 200)
    assert body["metadata"] == {"name": "the-name", "namespace": namespace}
    assert body["involvedObject"] == reference
    assert (body["type"], body["reason"], body["message"], body["count"]) == (
        WARNING, "DeletionFailed", "text", 7,
    )  # fmt: skip
    assert (body["firstTimestamp"], body["lastTimestamp"]) == (
        "2023-11-14T22:13:20Z",
        "2023-11-14T22:14:20Z",
    )
    assert body["reportingInstance"] == "x" * 128, "the API server's limit"


def test_event_names_are_the_object_and_the_time_in_hex() -> None:
    assert event_name(NODE, 0x17A2B) == "worker-1.17a2b"
    name, stamp = event_name(POD).split(".")
    assert name == "provider-0" and int(stamp, 16) > 0x17A2B


REFUSALS = [
    pytest.param(QuotaExceededError("Quota exceeded: servers.", 400, "create_server"), True),
    pytest.param(CapacityError("No capacity in lpg1.", 400, "create_server"), True),
    pytest.param(AuthenticationError("Invalid token.", 401, "create_server"), True),
    pytest.param(InvalidRequestError("Unknown image.", 400, "create_server"), True),
    pytest.param(NotFoundError("Not found.", 404, "create_server"), True),
    pytest.param(UnavailableError("Bad gateway.", 502, "create_server"), False),
    pytest.param(RateLimitedError("Slow down.", 429, "create_server"), False),
    pytest.param(CloudError("internal error: boom", None, "create_server"), False),
]


@pytest.mark.parametrize(("error", "refused"), REFUSALS)
def test_refused_creations_become_events_with_the_group_and_the_apis_text(
    error: CloudError, refused: bool
) -> None:
    message = refusal_message("workers", error)
    if not refused:
        assert message is None
        return
    assert message == (
        f"node group workers: the cloud API refused to create a server ({error.code}): "
        f"create_server: HTTP {error.status}: {error.message}"
    )
