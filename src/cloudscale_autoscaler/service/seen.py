"""The CA calls last seen per node group, for the status view: when CA last asked a group to
grow, shrink or delete nodes, and how often.

Only the calls that reach the service are seen. NodeGroupTargetSize and NodeGroupForNode are
mostly answered by the transport without Python (service/hot.py), so they are counted per
method by the transport's RPC counters instead. Calls naming no configured group are not
kept: a caller cannot grow this table.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass
class Seen:
    count: int = 0
    last_unix: float = 0.0


class CallsSeen:
    def __init__(self, groups: Iterable[str]) -> None:
        self._groups: dict[str, dict[str, Seen]] = {name: {} for name in groups}

    def record(self, group: str, rpc: str) -> None:
        calls = self._groups.get(group)
        if calls is None:
            return
        seen = calls.setdefault(rpc, Seen())
        seen.count += 1
        seen.last_unix = time.time()

    def follow(self, groups: Iterable[str]) -> None:
        """The configured groups after a reload: new ones start empty, removed ones go."""
        self._groups = {name: self._groups.get(name, {}) for name in groups}

    def of(self, group: str) -> Mapping[str, Seen]:
        return self._groups.get(group, {})
