"""Where an antiAffinity group's new creations go (engine/placement.py), as a table: each
server group fills up to the API's member limit before the next is used, new ones are made for
the rest, and what a create found full or is being deleted is not used."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import ServerGroup
from cloudscale_autoscaler.engine.background import Background
from cloudscale_autoscaler.engine.placement import MAX_MEMBERS, Placement, ServerGroups, Slot


def listed(**members: int) -> list[ServerGroup]:
    """Server groups named by their uuid, each with that many member servers."""
    return [
        ServerGroup(uuid, uuid, "lpg1", tuple(f"{uuid}-{i}" for i in range(count)))
        for uuid, count in members.items()
    ]


def where(slots: list[Slot]) -> list[str]:
    """Each slot's server group: its uuid, or "new<k>" for the k-th one being created."""
    news: dict[int, int] = {}
    out = []
    for slot in slots:
        if slot.uuid is not None:
            out.append(slot.uuid)
        else:
            assert slot.pending is not None
            out.append(f"new{news.setdefault(id(slot.pending), len(news))}")
    return out


@pytest.mark.parametrize(
    ("members", "placed", "count", "expected"),
    [
        ({}, {}, 1, ["new0"]),
        ({}, {}, 6, ["new0"] * 4 + ["new1"] * 2),
        ({"a": 4}, {}, 1, ["new0"]),  # full
        ({"a": 1, "b": 3}, {}, 3, ["b", "a", "a"]),  # the fullest first
        ({"a": 2}, {"a": 2}, 1, ["new0"]),  # full with creations already placed there
        ({"a": 2}, {"a": 1}, 3, ["a", "new0", "new0"]),
        ({"a": 0, "b": 0}, {}, 9, ["a"] * 4 + ["b"] * 4 + ["new0"]),
        ({"a": 3}, {}, 0, []),
    ],
    ids=["first", "two-new", "full", "fullest-first", "placed-counts", "fill-then-new",
         "empty-ones-first", "none"],
)  # fmt: skip
async def test_assign(
    members: dict[str, int], placed: dict[str, int], count: int, expected: list[str]
) -> None:
    placement = Placement("lpg1")
    placement.apply_listing(listed(**members), 0)
    slots = placement.assign(count, placed, "prod-workers")
    assert where(slots) == expected
    assert placement.count == len(members) + len({s.pending for s in slots if s.pending})
    for pending in placement.pending:
        assert pending.name.startswith("prod-workers-")


async def test_full_and_deleting_groups_are_not_used_until_the_next_listing() -> None:
    placement = Placement("lpg1")
    placement.apply_listing(listed(a=0, b=0), 0)
    placement.full.add("a")
    placement.deleting.add("b")
    assert where(placement.assign(1, {}, "p")) == ["new0"]
    placement.apply_listing(listed(a=1, b=0), 0)  # a is listed again: usable; b still goes
    assert where(placement.assign(1, {}, "p")) == ["a"]


async def test_empty_groups_are_those_without_members_or_placed_creations() -> None:
    placement = Placement("lpg1")
    placement.apply_listing(listed(a=0, b=0, c=2), 0)
    assert placement.empty({"b": 1}, now=10.0, grace=0.0) == ["a"]
    placement.deleting.add("a")
    assert placement.empty({"b": 1}, now=10.0, grace=0.0) == []


async def test_an_empty_group_goes_only_once_it_stayed_empty_for_the_grace() -> None:
    """A restarted provider (or a new leader) sees a server group empty that creates sent
    before it started may still be joining: it waits the journal's adoption bound first."""
    placement = Placement("lpg1")
    placement.apply_listing(listed(a=0, b=0), 0)
    assert placement.empty({}, now=100.0, grace=60.0) == []
    assert placement.empty({"b": 1}, now=130.0, grace=60.0) == []
    assert placement.empty({}, now=160.0, grace=60.0) == ["a"]  # b was not empty at 130
    assert placement.empty({}, now=190.0, grace=60.0) == ["a"]
    assert sorted(placement.empty({}, now=220.0, grace=60.0)) == ["a", "b"]


async def test_an_older_listing_undoes_none_of_our_own_creates_and_deletes() -> None:
    """A listing begun before we made (or deleted) a server group does not show it (or still
    shows it): applied over our changes since, it neither forgets nor resurrects it."""
    placement = Placement("lpg1")
    placement.apply_listing(listed(a=1, b=0), 5)
    placement.made(ServerGroup("c", "c", "lpg1", ()), 7)
    placement.gone("b", 8)
    placement.apply_listing(listed(a=1, b=0), 6)  # begun before both
    assert set(placement.known) == {"a", "c"}
    placement.apply_listing(listed(a=1, c=0), 9)  # begun after both: it tells
    assert set(placement.known) == {"a", "c"} and placement.changes == {}


async def test_a_slot_resolves_to_the_created_group() -> None:
    placement = Placement("lpg1")
    (slot,) = placement.assign(1, {}, "p")
    assert slot.pending is not None
    slot.pending.created.set_result("made")
    assert await asyncio.wait_for(slot.resolve(), 1) == "made"
    assert MAX_MEMBERS == 4


async def test_a_group_being_created_is_filled_before_another_is_made() -> None:
    """Scale-ups that come while a server group is being created go into it too."""
    placement = Placement("lpg1")
    first = placement.assign(1, {}, "p")
    placed = placement.placed((slot, None) for slot in first)
    second = placement.assign(4, placed, "p")
    assert where(first + second) == ["new0"] * 4 + ["new1"]
    assert placement.count == 2


async def test_a_server_group_of_another_zone_is_never_assigned() -> None:
    """The group's zone changed (a restart with another `zone`): the server groups it made in
    the old zone are still listed as its own, but a create names only one of its zone (the
    API refuses a server group of another zone); the old ones stay known, to be tidied."""
    placement = Placement("rma1")
    placement.apply_listing([*listed(a=1), ServerGroup("b", "b", "rma1", ())], 0)
    assert where(placement.assign(2, {}, "prod-workers")) == ["b", "b"]
    placement = Placement("rma1")
    placement.apply_listing(listed(a=1), 0)
    assert where(placement.assign(1, {}, "prod-workers")) == ["new0"]
    assert set(placement.known) == {"a"}


class _CrashingCloud:
    """A cloud whose server-group create fails with something other than a CloudError (a
    bug, a library's own exception): the one thing ServerGroups needs of a Cloud here."""

    async def create_server_group(
        self, name: str, zone: str, tags: dict[str, str], fence: object = None
    ) -> ServerGroup:
        raise RuntimeError("a bug in the client")


async def test_a_server_group_create_that_crashes_fails_the_creates_placed_in_it() -> None:
    """The creations placed in a server group being made wait for it; a failure outside
    CloudError left them waiting for ever (the scale-up hung, its slots taken)."""
    ticks = itertools.count(1)
    cloud: Any = _CrashingCloud()
    groups = ServerGroups(cloud, Background(), "prod", lambda: None, ticks.__next__)
    placement = Placement("lpg1")
    (slot,) = groups.place("workers", placement, 1, {})
    with pytest.raises(CloudError, match="internal error: RuntimeError"):
        await asyncio.wait_for(slot.resolve(), 2.0)
    assert placement.pending == [] and placement.known == {}
