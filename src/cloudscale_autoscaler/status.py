"""The status view: one snapshot of what this replica knows, the one source of `GET /status`
and of the `status` command's table. It sits at the package root beside `app.py` because it
is assembly too: it composes the engine, the service, reload and the metrics, so it must stand
above all of them (the endpoint in observability/ serves it through a callable).

Everything in it is read from state the provider keeps anyway (the engine's groups and last
Refresh, the service's calls seen, the serving gate, the served certificate, the transport's
RPC counters); taking it changes nothing. Nothing secret is in it: no token, no user data,
only names, counts, times and the cloud's error texts that CA logs too.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cloudscale_autoscaler import __version__
from cloudscale_autoscaler.engine.status import GroupStatus, RefreshOutcome, RemovedGroup
from cloudscale_autoscaler.observability.metrics import RpcReading
from cloudscale_autoscaler.reload.reloader import ReloadStatus
from cloudscale_autoscaler.service.seen import CallsSeen
from cloudscale_autoscaler.service.serving import Serving


@dataclass(frozen=True)
class LeaderStatus:
    lease: str  # namespace/name
    identity: str  # this replica's
    leading: bool
    holder: str | None  # the replica holding the Lease, if known


@dataclass(frozen=True)
class CallSeen:
    count: int
    last_unix: float


@dataclass(frozen=True)
class Status:
    at_unix: float
    groups: tuple[GroupStatus, ...]
    calls: Mapping[str, Mapping[str, CallSeen]]  # group -> RPC -> when last seen
    refresh: RefreshOutcome | None
    last_successful_refresh_unix: float | None
    leader: LeaderStatus | None  # None without leader election
    tls_not_after_unix: float | None  # None without TLS
    rpcs: Mapping[str, Mapping[str, int]]  # RPC -> status code -> calls answered
    # The config file and its last reload; None when serving a config not read from a file.
    config: ReloadStatus | None = None
    # What is left of groups no longer (or never) configured, by group tag: kept, unserved.
    unconfigured: Mapping[str, RemovedGroup] = dataclasses.field(default_factory=dict)
    version: str = __version__

    def to_json(self) -> dict[str, Any]:
        refresh = self.refresh
        return {
            "version": self.version,
            "at_unix": self.at_unix,
            "groups": [
                {
                    **dataclasses.asdict(group),
                    "calls": {
                        rpc: dataclasses.asdict(seen)
                        for rpc, seen in self.calls.get(group.name, {}).items()
                    },
                }
                for group in self.groups
            ],
            "refresh": None
            if refresh is None
            else {**dataclasses.asdict(refresh), "ok": refresh.ok},
            "last_successful_refresh_unix": self.last_successful_refresh_unix,
            "leader": None if self.leader is None else dataclasses.asdict(self.leader),
            "tls_not_after_unix": self.tls_not_after_unix,
            "rpcs": {method: dict(codes) for method, codes in self.rpcs.items()},
            "config": None if self.config is None else dataclasses.asdict(self.config),
            "unconfigured_groups": {
                name: dataclasses.asdict(left) for name, left in self.unconfigured.items()
            },
        }


def leader_status(serving: Serving, identity: str | None) -> LeaderStatus | None:
    if identity is None:
        return None
    leading = serving.active
    return LeaderStatus(serving.lease, identity, leading, identity if leading else serving.leader)


def collect(
    groups: Iterable[GroupStatus],
    seen: CallsSeen,
    refresh: RefreshOutcome | None,
    last_successful_refresh_unix: float,
    leader: LeaderStatus | None,
    tls_not_after_unix: float | None,
    rpcs: Iterable[RpcReading],
    config: ReloadStatus | None = None,
    unconfigured: Mapping[str, RemovedGroup] | None = None,
) -> Status:
    """The snapshot from its parts (`last_successful_refresh_unix` 0: never)."""
    taken = tuple(groups)
    return Status(
        at_unix=time.time(),
        groups=taken,
        calls={
            g.name: {rpc: CallSeen(s.count, s.last_unix) for rpc, s in seen.of(g.name).items()}
            for g in taken
        },
        refresh=refresh,
        last_successful_refresh_unix=last_successful_refresh_unix or None,
        leader=leader,
        tls_not_after_unix=tls_not_after_unix,
        rpcs={r.method: r.codes for r in rpcs if r.codes},
        config=config,
        unconfigured=dict(unconfigured or {}),
    )
