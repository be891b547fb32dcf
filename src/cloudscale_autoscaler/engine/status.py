"""The engine's part of the status view: each node group's state and the last Refresh, read
from what the engine keeps anyway (pure: reading never expires a placeholder or changes a
count).

Servers are counted by the state CA sees them in (NodeGroupNodes), so the figures agree with
what CA logs; placeholders carry the cloud's refusal as CA gets it (code, text, error class).
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudscale_autoscaler.engine import instances
from cloudscale_autoscaler.engine.group import GroupState
from cloudscale_autoscaler.engine.providerid import placeholder_provider_id
from cloudscale_autoscaler.engine.records import (
    ERROR_CLASS_OUT_OF_RESOURCES,
    CreationState,
    Placeholder,
)

# The InstanceErrorClass values by CA's names for them; CA treats every other value as Other.
ERROR_CLASS_NAMES = {ERROR_CLASS_OUT_OF_RESOURCES: "OutOfResources"}
OTHER_ERROR_CLASS = "Other"


@dataclass(frozen=True)
class RemovedGroup:
    """What remains of a node group that is not configured (removed or renamed by a reload,
    or before this process started): kept, never deleted, reported until gone."""

    servers: int  # listed servers carrying its group tag
    creations_in_flight: int  # creates sent before the reload and not listed yet
    server_groups: int  # managed anti-affinity server groups carrying its name

    @property
    def empty(self) -> bool:
        return not (self.servers or self.creations_in_flight or self.server_groups)


@dataclass(frozen=True)
class ServerCounts:
    """Listed servers by the state CA sees; `error` ones are also shown to CA as creating."""

    running: int = 0
    creating: int = 0
    deleting: int = 0
    error: int = 0
    other: int = 0


@dataclass(frozen=True)
class PlaceholderStatus:
    """A failed creation that CA sees as an instance, with the cloud's refusal."""

    provider_id: str
    error_code: str
    error: str
    error_class: str
    age_seconds: float
    expires_in_seconds: float


@dataclass(frozen=True)
class GroupStatus:
    name: str
    min_size: int
    max_size: int
    target_size: int
    servers: ServerCounts
    # Creations sent to the API and not yet listed as servers.
    creations_in_flight: int
    # Creations waiting for a create slot (maxConcurrentCreates): not sent yet.
    creations_queued: int
    # Our DELETEs still running.
    deletions_in_flight: int
    # Servers tagged for deletion that nobody deletes right now (Refresh resumes them).
    deletions_pending: int
    placeholders: tuple[PlaceholderStatus, ...]
    # Anti-affinity server groups the provider manages for it (antiAffinity), listed or being
    # created.
    server_groups: int
    # The target is below minSize: CA does not scale a group up to its minSize by itself.
    below_min_size: bool


@dataclass(frozen=True)
class RefreshOutcome:
    """How the last inventory refresh (Refresh, or a load at start or takeover) went."""

    at_unix: float
    seconds: float
    error: str | None = None  # None: it succeeded

    @property
    def ok(self) -> bool:
        return self.error is None


def error_class_name(error_class: int) -> str:
    return ERROR_CLASS_NAMES.get(error_class, OTHER_ERROR_CLASS)


def placeholder_status(placeholder: Placeholder, now: float, lifetime: float) -> PlaceholderStatus:
    """`now` on the clock the placeholder was created by; `lifetime`: placeholderExpiry."""
    age = max(0.0, now - placeholder.created)
    return PlaceholderStatus(
        provider_id=placeholder_provider_id(placeholder.ident),
        error_code=placeholder.code,
        error=placeholder.message,
        error_class=error_class_name(placeholder.error_class),
        age_seconds=age,
        expires_in_seconds=max(0.0, lifetime - age),
    )


def server_counts(group: GroupState, now_unix: float) -> ServerCounts:
    counts = {"running": 0, "creating": 0, "deleting": 0, "error": 0, "other": 0}
    for uuid, server in group.servers.items():
        if uuid in group.deleting or group.deletion_requested(uuid):
            state = "deleting"
        elif server.status == "error":
            state = "error"
        else:
            # Only a `changing` server's creation time matters (parsing it costs, per server).
            booting = server.status == "changing" and instances.booting(server, now_unix)
            seen = instances.server_state(server.status, booting)
            state = _STATE_NAMES.get(seen, "other")
        counts[state] += 1
    return ServerCounts(**counts)


_STATE_NAMES = {instances.RUNNING: "running", instances.CREATING: "creating"}


def group_status(group: GroupState, now: float, now_unix: float, lifetime: float) -> GroupStatus:
    """`now`: the engine's (monotonic) clock, which placeholder ages are counted on."""
    pending = list(group.pending_creations())
    queued = sum(1 for c in pending if c.state is CreationState.QUEUED)
    target = group.target()
    return GroupStatus(
        name=group.name,
        min_size=group.config.min_size,
        max_size=group.config.max_size,
        target_size=target,
        servers=server_counts(group, now_unix),
        creations_in_flight=len(pending) - queued,
        creations_queued=queued,
        deletions_in_flight=len(group.deleting),
        deletions_pending=len(group.marked_for_deletion()),
        placeholders=tuple(
            placeholder_status(p, now, lifetime) for p in group.placeholders.values()
        ),
        server_groups=0 if group.placement is None else group.placement.count,
        below_min_size=target < group.config.min_size,
    )
