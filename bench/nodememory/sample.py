"""One container's memory three ways: its cgroup (what the kernel charges it and the limit is
enforced on), the kubelet's summary API (what `kubectl top` and the eviction manager read) and
its main process's /proc status (the RSS the bench's other workloads report).

The working set is the kubelet's (cAdvisor's) figure: the cgroup's usage less its inactive
file pages, which the kernel reclaims before it would kill the container."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.nodememory.testbed import RealNode

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTAINER = "cloudscale-autoscaler"  # the chart's container name


@dataclass(frozen=True)
class Container:
    """The provider's container in one Pod, as the host sees it."""

    pod: str
    pid: int  # its main process: the image's entrypoint is the provider itself
    cgroup: Path  # the memory controller's directory
    v1: bool  # cgroup v1 (its file names differ from v2's)


@dataclass(frozen=True)
class Sample:
    pod: str
    working_set: int  # cgroup usage - inactive file, bytes
    usage: int  # cgroup usage, page cache included
    peak: int  # the cgroup's high-water mark since the container started
    limit: int  # what the kernel enforces: the chart's limits.memory
    kubelet_working_set: int | None  # the summary API's (None until the kubelet has it)
    rss: int  # the main process's VmRSS
    rss_anon: int  # its anonymous part (heap, stacks): the process's own
    # Its mapped files (the interpreter, libraries), shared with the other replica: RssFile plus
    # RssShmem, as the test node's containerd keeps the image's files on a tmpfs.
    rss_file: int
    hwm: int  # its VmHWM


def _task_pids(node: RealNode) -> dict[str, int]:
    """containerd's tasks (container ID -> PID) in the CRI plugin's namespace."""
    listed = node.ctr("tasks", "ls")
    if listed.returncode != 0:
        raise RuntimeError(f"ctr tasks ls failed: {listed.stderr.strip()}")
    pids = {}
    for line in listed.stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2 and fields[1].isdigit():
            pids[fields[0]] = int(fields[1])
    return pids


def _memory_cgroup(pid: int) -> tuple[Path, bool]:
    """The memory controller's directory of `pid`: cgroup v1's memory hierarchy when it has
    one (hybrid hosts), else the unified one."""
    unified = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / "memory" / path.lstrip("/"), True
        if controllers == "":
            unified = CGROUP_ROOT / path.lstrip("/")
    if unified is None:
        raise RuntimeError(f"process {pid} is in no memory cgroup")
    return unified, False


def containers(node: RealNode, pods: list[Any]) -> list[Container]:
    """The provider's container of each Pod."""
    pids = _task_pids(node)
    found = []
    for pod in pods:
        [status] = [s for s in pod.status.container_statuses if s.name == CONTAINER]
        container_id = status.container_id.rpartition("://")[2]
        if container_id not in pids:
            raise RuntimeError(f"{pod.metadata.name}: no containerd task {container_id}")
        pid = pids[container_id]
        cgroup, v1 = _memory_cgroup(pid)
        found.append(Container(pod.metadata.name, pid, cgroup, v1))
    return found


def _read_int(path: Path) -> int:
    text = path.read_text().strip()
    return 2**63 - 1 if text == "max" else int(text)


def _stat(cgroup: Path) -> dict[str, int]:
    lines = (line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    return {key: int(value) for key, value in lines}


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, RssShmem and VmHWM of `pid`, bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def kubelet_working_sets(node: RealNode) -> dict[str, int]:
    """The kubelet's working set of the provider's container, by Pod name (its summary API,
    through the apiserver's node proxy: as metrics-server reads it)."""
    core = node.core()
    response: Any = core.connect_get_node_proxy_with_path(
        node.name, "stats/summary", _preload_content=False
    )
    summary = json.loads(response.data)
    out = {}
    for pod in summary.get("pods", []):
        for container in pod.get("containers", []):
            memory = container.get("memory", {})
            if container["name"] == CONTAINER and "workingSetBytes" in memory:
                out[pod["podRef"]["name"]] = int(memory["workingSetBytes"])
    return out


def sample(container: Container, kubelet: dict[str, int]) -> Sample:
    cgroup, stat = container.cgroup, _stat(container.cgroup)
    if container.v1:
        usage = _read_int(cgroup / "memory.usage_in_bytes")
        inactive = stat["total_inactive_file"]
        peak = _read_int(cgroup / "memory.max_usage_in_bytes")
        limit = _read_int(cgroup / "memory.limit_in_bytes")
    else:
        usage = _read_int(cgroup / "memory.current")
        inactive = stat["inactive_file"]
        peak = _read_int(cgroup / "memory.peak")
        limit = _read_int(cgroup / "memory.max")
    process = _proc_status(container.pid)
    return Sample(
        pod=container.pod,
        working_set=max(0, usage - inactive),
        usage=usage,
        peak=peak,
        limit=limit,
        kubelet_working_set=kubelet.get(container.pod),
        rss=process["VmRSS"],
        rss_anon=process["RssAnon"],
        rss_file=process["RssFile"] + process["RssShmem"],
        hwm=process["VmHWM"],
    )
