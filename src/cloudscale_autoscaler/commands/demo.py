"""`cloudscale-autoscaler demo`: the whole loop on the built-in emulator, in one command.

It starts the cloudscale.ch API emulator and the provider (mutual TLS with freshly minted
development certificates), then plays the calls the Cluster Autoscaler makes over gRPC and
prints what each answer means: the node groups, a template, a scale-up from zero, a creation
that fails and becomes a placeholder CA deletes, and a scale-down. Then it keeps serving and
prints ready-to-paste `cloudscale-autoscaler rpc` commands (or exits with --once).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx

from cloudscale_autoscaler.app import Running, start_provider
from cloudscale_autoscaler.cloud.emulator.server import Emulator
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import Config
from cloudscale_autoscaler.transport.certs import mint_dev_pki
from cloudscale_autoscaler.transport.server import ListenError

DEMO_TOKEN = "demo-token"
PREFERRED_PORT = 8086
# Creations boot for this long in the emulator, so "creating" is visible before "running".
BOOT_SECONDS = 1.0
RPC_TIMEOUT = 5.0  # CA's default per-RPC timeout

CONFIG_TEMPLATE = """\
cluster: demo
listen: 127.0.0.1:{port}
tls:
  cert: certs/server.crt
  key: certs/server.key
  clientCA: certs/ca.crt
cloudscale:
  url: {api_url}
  tokenFile: token
  maxConcurrentCreates: 10
placeholderExpiry: 15m
stateDir: state
nodeGroups:
  - name: workers
    minSize: 0
    maxSize: 5
    flavor: flex-8-4
    image: debian-12
    zone: lpg1
    volumeSizeGB: 50
    labels: {{node-role.example.com/worker: ""}}
    kubelet:
      systemReserved: {{cpu: 100m, memory: 512Mi}}
    userData: |
      #cloud-config
      # kubelet flags: --node-labels=${{node_labels}} --register-with-taints=${{node_taints}}
      hostname: ${{server_name}}
  - name: gpu
    minSize: 0
    maxSize: 2
    flavor: gpu2-128-16-1-200
    image: ubuntu-24.04
    zone: rma1
    volumeSizeGB: 100
    taints:
      - {{key: nvidia.com/gpu, value: present, effect: NoSchedule}}
    # ${{node_labels}} carries the GPU label CA waits for on a booting GPU node.
    userData: |
      #cloud-config
      # kubelet flags: --node-labels=${{node_labels}} --register-with-taints=${{node_taints}}
      hostname: ${{server_name}}
"""


class Timeline:
    """Prints numbered steps with the time since the demo started."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._step = 0

    def step(self, title: str) -> None:
        self._step += 1
        print(f"\n[{self._elapsed()}] {self._step}. {title}", flush=True)

    def say(self, text: str) -> None:
        print(textwrap.indent(text, f"[{self._elapsed()}]    "), flush=True)

    def _elapsed(self) -> str:
        return f"+{time.monotonic() - self._start:6.2f}s"


def write_workspace(directory: Path, api_url: str, port: int, token: str = DEMO_TOKEN) -> Path:
    """The demo's config file, its certificates and token file in `directory` (what
    tests/test_shipped_configs.py checks as a user's `check-config --online` would)."""
    certs = directory / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    pki = mint_dev_pki()
    pki.ca.write(certs / "ca.crt")
    pki.server.write(certs / "server.crt", certs / "server.key")
    pki.client.write(certs / "client.crt", certs / "client.key")
    token_file = directory / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    config = directory / "config.yaml"
    config.write_text(CONFIG_TEMPLATE.format(port=port, api_url=api_url))
    return config


async def _serve(config: Config) -> Running:
    """The provider as `serve` runs it, on the preferred port or else a free one."""
    try:
        return await start_provider(config)
    except ListenError:
        return await start_provider(config, listen="127.0.0.1:0")


def _channel(certs: Path, port: int) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / "client.key").read_bytes(),
        certificate_chain=(certs / "client.crt").read_bytes(),
    )
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials)


def _instance_line(instance: pb.Instance) -> str:
    state = pb.InstanceStatus.InstanceState.Name(instance.status.instanceState)
    line = f"{instance.id}  {state}"
    error = instance.status.errorInfo
    if error.errorCode:
        line += f"  error={error.errorCode} class={error.instanceErrorClass}: {error.errorMessage}"
    return line


class DemoClient:
    """The calls CA makes, with the per-RPC timeout CA uses."""

    def __init__(self, stub: pb_grpc.CloudProviderStub) -> None:
        self.stub = stub

    async def refresh(self) -> None:
        await self.stub.Refresh(pb.RefreshRequest(), timeout=RPC_TIMEOUT)

    async def target(self, group: str) -> int:
        request = pb.NodeGroupTargetSizeRequest(id=group)
        answer = await self.stub.NodeGroupTargetSize(request, timeout=RPC_TIMEOUT)
        return int(answer.targetSize)

    async def instances(self, group: str) -> list[pb.Instance]:
        request = pb.NodeGroupNodesRequest(id=group)
        answer = await self.stub.NodeGroupNodes(request, timeout=RPC_TIMEOUT)
        return list(answer.instances)

    async def wait_for(
        self, group: str, done: Callable[[list[pb.Instance]], bool], seconds: float = 30.0
    ) -> list[pb.Instance]:
        """Refresh and list like CA's loop until `done` holds (bounded)."""
        deadline = time.monotonic() + seconds
        while True:
            await self.refresh()
            instances = await self.instances(group)
            if done(instances) or time.monotonic() > deadline:
                return instances
            await asyncio.sleep(0.25)


def _running(instances: list[pb.Instance]) -> int:
    running = pb.InstanceStatus.instanceRunning
    return sum(1 for i in instances if i.status.instanceState == running)


def _placeholders(instances: list[pb.Instance]) -> list[pb.Instance]:
    return [i for i in instances if i.status.errorInfo.errorCode]


async def _show_groups_and_template(ca: DemoClient, timeline: Timeline) -> None:
    timeline.step("NodeGroups: what CA learns at start")
    groups = await ca.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=RPC_TIMEOUT)
    for group in groups.nodeGroups:
        timeline.say(f"group {group.id}: min {group.minSize}, max {group.maxSize}")

    timeline.step("NodeGroupTemplateNodeInfo(workers): the node CA simulates for scale-from-zero")
    request = pb.NodeGroupTemplateNodeInfoRequest(id="workers")
    answer = await ca.stub.NodeGroupTemplateNodeInfo(request, timeout=RPC_TIMEOUT)
    node = core_v1_pb2.Node()
    node.ParseFromString(answer.nodeBytes)
    same = answer.nodeInfo.SerializeToString(deterministic=True) == answer.nodeBytes
    status = node.status
    for resource in ("cpu", "memory", "ephemeral-storage", "pods"):
        timeline.say(
            f"{resource:<18} capacity {status.capacity[resource].string:<10} "
            f"allocatable {status.allocatable[resource].string}"
        )
    instance_type = node.metadata.labels["node.kubernetes.io/instance-type"]
    zone = node.metadata.labels.get("topology.kubernetes.io/zone", "-")
    timeline.say(f"instance-type {instance_type}, zone {zone}; nodeBytes == nodeInfo: {same}")


async def _scale_up_from_zero(ca: DemoClient, timeline: Timeline) -> None:
    timeline.step("Scale up from zero: NodeGroupIncreaseSize(workers, +2)")
    await ca.refresh()
    timeline.say(f"target before: {await ca.target('workers')}")
    started = time.monotonic()
    await ca.stub.NodeGroupIncreaseSize(
        pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2), timeout=RPC_TIMEOUT
    )
    took = (time.monotonic() - started) * 1000
    timeline.say(f"IncreaseSize returned in {took:.0f} ms; target now {await ca.target('workers')}")
    instances = await ca.wait_for("workers", lambda found: _running(found) >= 2)
    for instance in instances:
        timeline.say(_instance_line(instance))


async def _failed_creation(ca: DemoClient, admin: httpx.AsyncClient, timeline: Timeline) -> None:
    timeline.step("A creation fails: the zone runs out of capacity for one of two new servers")
    faults = {"fail_next_creates": {"count": 1, "kind": "capacity"}}
    (await admin.put("/faults", json=faults)).raise_for_status()
    await ca.stub.NodeGroupIncreaseSize(
        pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2), timeout=RPC_TIMEOUT
    )
    instances = await ca.wait_for("workers", lambda found: bool(_placeholders(found)))
    (await admin.delete("/faults")).raise_for_status()
    timeline.say(f"target {await ca.target('workers')}; instances:")
    for instance in instances:
        timeline.say("  " + _instance_line(instance))
    failed = _placeholders(instances)
    if not failed:
        timeline.say("no placeholder appeared (unexpected)")
        return
    timeline.step("CA backs the group off and deletes the failed instance (a fake node)")
    fake = [pb.ExternalGrpcNode(providerID=i.id, name=i.id) for i in failed]
    await ca.stub.NodeGroupDeleteNodes(
        pb.NodeGroupDeleteNodesRequest(id="workers", nodes=fake), timeout=RPC_TIMEOUT
    )
    timeline.say(f"placeholder gone, target rolled back to {await ca.target('workers')}")


async def _scale_down(ca: DemoClient, timeline: Timeline) -> None:
    timeline.step("Scale down: CA deletes the unneeded nodes by providerID")
    await ca.refresh()
    real = [i for i in await ca.instances("workers") if not i.status.errorInfo.errorCode]
    nodes = [pb.ExternalGrpcNode(providerID=i.id, name=i.id) for i in real]
    await ca.stub.NodeGroupDeleteNodes(
        pb.NodeGroupDeleteNodesRequest(id="workers", nodes=nodes), timeout=RPC_TIMEOUT
    )
    timeline.say(f"deleted {len(nodes)} servers; target now {await ca.target('workers')}")
    instances = await ca.wait_for("workers", lambda found: not found)
    timeline.say(f"after Refresh: {len(instances)} instances left in the cloud")


def write_cloud_config(workspace: Path, port: int) -> Path:
    """CA's cloud-config for the demo's provider: what `rpc --cloud-config` reads."""
    certs = workspace / "certs"
    path = workspace / "cloud-config.yaml"
    path.write_text(
        f"address: 127.0.0.1:{port}\ncert: {certs}/client.crt\nkey: {certs}/client.key\n"
        f"cacert: {certs}/ca.crt\ngrpc_timeout: 15s\n"
    )
    return path


def _rpc_help(workspace: Path, port: int, api_url: str) -> str:
    rpc = f"cloudscale-autoscaler rpc --cloud-config {workspace}/cloud-config.yaml"
    return textwrap.dedent(
        f"""
        The provider serves on 127.0.0.1:{port} (mutual TLS); the emulated API on {api_url}.
        Call it as CA does (CA's cloud-config and client certificate), in another terminal:

          {rpc} NodeGroups
          {rpc} NodeGroupTargetSize --group workers
          {rpc} NodeGroupIncreaseSize '{{"id": "workers", "delta": 1}}'
          {rpc} NodeGroupNodes --group workers
          {rpc} NodeGroupDeleteNodes --group workers \\
              --node <a cloudscale://... id from NodeGroupNodes>
        """
    )


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("Serving until Ctrl-C.", flush=True)
    await stop.wait()


@contextlib.contextmanager
def _workspace(certs_dir: Path | None) -> Iterator[Path]:
    if certs_dir is not None:
        certs_dir.mkdir(parents=True, exist_ok=True)
        yield certs_dir
        return
    with tempfile.TemporaryDirectory(prefix="cloudscale-autoscaler-demo-") as tmp:
        yield Path(tmp)


async def run_demo(*, once: bool, directory: Path | None = None) -> int:
    timeline = Timeline()
    with _workspace(directory) as workspace:
        return await _run_in(workspace, timeline, once=once)


async def _run_in(workspace: Path, timeline: Timeline, *, once: bool) -> int:
    async with Emulator(token=DEMO_TOKEN, seed=0, boot_seconds=BOOT_SECONDS) as emulator:
        config_path = write_workspace(workspace, emulator.url, PREFERRED_PORT)
        config = load_config(config_path)
        server = await _serve(config)
        timeline.step(f"Emulator on {emulator.url}; provider on 127.0.0.1:{server.port} (mTLS)")
        timeline.say(f"config: {config_path}")
        certs = workspace / "certs"
        try:
            async with (
                _channel(certs, server.port) as channel,
                httpx.AsyncClient(base_url=emulator.admin_url) as admin,
            ):
                ca = DemoClient(pb_grpc.CloudProviderStub(channel))  # type: ignore[no-untyped-call]
                await _show_groups_and_template(ca, timeline)
                await _scale_up_from_zero(ca, timeline)
                await _failed_creation(ca, admin, timeline)
                await _scale_down(ca, timeline)
            timeline.step("Done: scale-up from zero, a placeholder for a failure, scale-down")
            if not once:
                write_cloud_config(workspace, server.port)
                print(_rpc_help(workspace, server.port, emulator.url), flush=True)
                await _wait_for_signal()
        finally:
            await server.stop(1.0)
    return 0


def demo_command(*, once: bool, certs_dir: Path | None) -> int:
    try:
        return asyncio.run(run_demo(once=once, directory=certs_dir))
    except grpc.aio.AioRpcError as exc:
        print(f"demo: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
