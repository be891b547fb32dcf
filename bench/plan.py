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
class LoopPattern:
    """What one idle CA loop of a CA generation sends besides one Refresh and one NodeGroups;
    bench/README.md ("The CA loop patterns") says where each count comes from."""

    name: str
    static_lookups: int  # NodeGroupForNode per loop for a node not ours (ours: one, cached)
    options_per_node: int  # GetOptions per node of ours
    target_sizes_per_group: int
    templates: int  # TemplateNodeInfo per loop

    def client_args(self) -> list[str]:
        return [
            "-static-lookups",
            str(self.static_lookups),
            "-options-per-node",
            str(self.options_per_node),
            "-target-sizes-per-group",
            str(self.target_sizes_per_group),
            "-templates",
            str(self.templates),
        ]

    def calls_per_loop(self, nodes: int, managed: int, groups: int) -> dict[str, int]:
        """Every RPC's calls in one loop, for `nodes` nodes of which `managed` are ours."""
        return {
            "Refresh": 1,
            "NodeGroups": 1,
            "NodeGroupForNode": managed + (nodes - managed) * self.static_lookups,
            "TemplateNodeInfo": min(self.templates, groups),
            "TargetSize": groups * self.target_sizes_per_group,
            "GetOptions": managed * self.options_per_node,
        }


CA_1_34 = LoopPattern(
    "CA 1.34", static_lookups=3, options_per_node=0, target_sizes_per_group=4, templates=1
)
CA_1_36 = LoopPattern(
    "CA 1.36", static_lookups=4, options_per_node=2, target_sizes_per_group=4, templates=1
)
PATTERNS = {"1.34": CA_1_34, "1.36": CA_1_36}


@dataclass(frozen=True)
class BenchPlan:
    # a. the CA loop of each pattern at every (size, groups), ours and the Go reference
    loop_sizes: tuple[int, ...] = (100, 1000, 5000)
    loop_groups: tuple[int, ...] = (1, 10)
    loops: int = 3
    loop_patterns: tuple[LoopPattern, ...] = (CA_1_34, CA_1_36)
    # b. single RPCs, ours and the Go reference, on a stack of this size
    single_size: int = 1000
    single_groups: int = 1
    single_calls: int = 3000
    single_warmup: int = 300
    single_rounds: int = 3  # ours, goref, pyref, ours, ...: the best round of each counts
    # f. forwarded RPCs one at a time on our server (the single-RPC stack, after its loop):
    # IncreaseSize(1), DeleteNodes(one node), Refresh
    forwarded_calls: int = 100
    forwarded_warmup: int = 10
    # c. Refresh alone
    refresh_sizes: tuple[int, ...] = (1000, 5000, 20000)
    refresh_calls: int = 5
    # e. resident memory once listening, after a CA loop, after a storm of Refresh calls
    rss_sizes: tuple[int, ...] = (5000, 20000)
    storm_refreshes: int = 30
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
    forwarded_calls=5,
    forwarded_warmup=1,
    refresh_sizes=(100,),
    refresh_calls=2,
    rss_sizes=(100,),
    storm_refreshes=3,
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


@dataclass(frozen=True)
class RealCaPlan:
    """The real Cluster Autoscaler binary of each generation against N idle nodes of ours in
    one group (bench/README.md, "Real Cluster Autoscaler")."""

    sizes: tuple[int, ...]
    generations: tuple[str, ...]  # versions as tests/fixtures/autoscaler.py pins them
    steady_loops: int = 5  # measured after the first loop
    scan_interval_s: int = 10  # CA's --scan-interval (its default)
    # How long CA may take from its start to the end of its first loop, and from one loop's
    # end to the next one's.
    loop_timeout_s: float = 900.0


@dataclass(frozen=True)
class NodeMemoryPlan:
    """The chart on a real node: its containers' memory at idle and under the real CA's loop
    at `nodes` Nodes (bench/README.md, "Memory on a real node")."""

    nodes: int = 1000
    ca_version: str = "1.36.1"  # CA's generation, as tests/fixtures/autoscaler.py pins them
    idle_seconds: float = 60.0  # sampled after both replicas are Ready
    loops: int = 6  # CA loops sampled after its first one
    scan_interval_s: int = 10  # CA's --scan-interval (its default)
    sample_period_s: float = 2.0
    loop_timeout_s: float = 300.0  # CA's start -> its first loop's end, and loop to loop
