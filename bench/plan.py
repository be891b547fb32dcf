"""What a benchmark run measures: sizes, counts and limits of every workload."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class IncreasePlan:
    """IncreaseSize(delta) against an emulator that takes `latency_ms` per create, with our
    server's create concurrency and request rate limited."""

    delta: int = 100
    latency_ms: int = 2000
    max_concurrent_creates: int = 10
    requests_per_second: float = 10.0
    max_seconds: float = 300.0


@dataclass(frozen=True)
class BenchPlan:
    # a. the CA loop at every (size, groups)
    loop_sizes: tuple[int, ...] = (100, 1000, 5000)
    loop_groups: tuple[int, ...] = (1, 10)
    loops: int = 3
    # b. single RPCs, ours and the Go reference, on a stack of this size
    single_size: int = 1000
    single_groups: int = 1
    single_calls: int = 3000
    single_warmup: int = 300
    single_rounds: int = 3  # ours, goref, pyref, ours, ...: the best round of each counts
    # c. Refresh alone
    refresh_sizes: tuple[int, ...] = (1000, 5000, 20000)
    refresh_calls: int = 5
    # e. resident memory after a CA loop
    rss_sizes: tuple[int, ...] = (5000, 20000)
    # Groups of the refresh and memory stacks.
    groups: int = 10
    increase: IncreasePlan = field(default_factory=IncreasePlan)
    # Time bound of any one client run.
    max_seconds: float = 600.0

    def stacks(self) -> list[tuple[int, int]]:
        """Every (size, groups) the run needs a populated emulator and a server for."""
        wanted = {(n, g) for n in self.loop_sizes for g in self.loop_groups}
        wanted |= {(n, self.groups) for n in (*self.refresh_sizes, *self.rss_sizes)}
        wanted.add((self.single_size, self.single_groups))
        return sorted(wanted)


FULL = BenchPlan()

# A few seconds of work end to end: what the CI smoke test runs.
SMOKE = BenchPlan(
    loop_sizes=(100,),
    loop_groups=(1,),
    loops=2,
    single_size=100,
    single_groups=1,
    single_calls=50,
    single_warmup=10,
    single_rounds=1,
    refresh_sizes=(100,),
    refresh_calls=2,
    rss_sizes=(100,),
    groups=1,
    increase=IncreasePlan(
        delta=5,
        latency_ms=100,
        max_concurrent_creates=2,
        requests_per_second=20.0,
        max_seconds=60.0,
    ),
    max_seconds=120.0,
)
