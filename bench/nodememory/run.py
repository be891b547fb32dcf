"""One node-memory run: the cluster with a real Node, the chart installed on it as a user does
(`helm install --wait`, two replicas, certificates in Secrets, the config pointed at the
emulator), its containers sampled at idle, then kwok Nodes for `nodes` servers of the group and
the real CA calling the leader through the gRPC Service's ClusterIP, sampled loop after loop."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.nodememory import sample
from bench.nodememory.testbed import (
    KWOK_ANNOTATION,
    Autoscaler,
    GatewayEmulator,
    RealNode,
    all_ready,
    ensure_image,
    helm_install,
    lease_holder,
    live_pods,
    run_autoscaler,
    running_emulator,
    running_kwok,
    running_node,
    wait_for,
    write_secret_files,
)
from bench.plan import NodeMemoryPlan
from bench.procs import free_port
from bench.promtext import Scrape, scrape
from bench.realca import nodes as kubenodes
from bench.realca.autoscaler import flags
from bench.realca.measure import CA_ERRORS, CA_NODES, FUNCTION_COUNT, OUR_REQUESTS
from bench.report import machine, run_record
from bench.stack import FLAVOR, IMAGE, ZONE
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP
from cloudscale_autoscaler.transport.certs import mint_ca

log = logging.getLogger("bench")

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "cloudscale-autoscaler"
RELEASE = "bench"
NAMESPACE = "kube-system"
FULLNAME = f"{RELEASE}-cloudscale-autoscaler"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
CLUSTER = "bench"
GROUP = "workers"
INSTALL_TIMEOUT = "180s"
READY_SECONDS = 60.0
METRICS_PORT = 8080  # the chart's ports.metrics
# The emulated servers' Nodes run nothing: no Pod of the cluster may land there (a replacement
# provider Pod included). CA counts a Node with a taint of its own as ready.
NO_KUBELET = {"key": "bench.cloudscale.ch/no-kubelet", "value": "true", "effect": "NoSchedule"}
KWOK_NODES = kubenodes.Extras({KWOK_ANNOTATION: "fake"}, [NO_KUBELET])
REGISTER_READY_SECONDS = 300.0


def run_node_memory(plan: NodeMemoryPlan, out: Path, command: str) -> dict[str, Any]:
    started = time.time()
    description = machine()
    log.info("the project's image: locating (or building) it")
    image = ensure_image()
    workdir = out / "node-memory"
    workdir.mkdir(parents=True, exist_ok=True)
    with running_node() as node:
        log.info("real node up; importing %s", image)
        node.import_image(image)
        with running_emulator(node.gateway, node.directory) as emulator:
            installed = _install(node, image, emulator, workdir, plan.nodes)
            log.info("both replicas Ready: %.0fs at idle", plan.idle_seconds)
            idle = _sample_for(node, plan.idle_seconds, plan.sample_period_s)
            with running_kwok(node.kube, node.directory):
                _populate(node, emulator, plan.nodes)
                loaded = _under_ca(node, plan, installed, workdir)
    return {
        **run_record(description, command, started),
        "plan": asdict(plan),
        "resources": _chart_defaults()["resources"],
        "install_s": installed.seconds,
        "phases": {"idle": {"samples": idle}, "ca": loaded},
    }


def _chart_defaults() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


@dataclass(frozen=True)
class Installed:
    seconds: float  # helm install --wait
    client: Path  # CA's client certificate files (tls.crt, tls.key, ca.crt)


def _install(
    node: RealNode, image: str, emulator: GatewayEmulator, workdir: Path, nodes: int
) -> Installed:
    """The chart's defaults but for what a user must set: the image (imported, never pulled),
    no cert-manager, the cloud API, one node group with room for `nodes` servers."""
    repository, _, tag = image.rpartition(":")
    group = {"name": GROUP, "minSize": 0, "maxSize": nodes + 100, "flavor": FLAVOR,
             "image": IMAGE, "zone": ZONE}  # fmt: skip
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "certManager": {"enabled": False},
        "config": {"cluster": CLUSTER, "cloudscale": {"url": emulator.url},
                   "nodeGroups": [group]},
    }  # fmt: skip
    ca = mint_ca("cloudscale-autoscaler bench CA")
    done, seconds, secrets = helm_install(
        node.kube, RELEASE, NAMESPACE, values, ca, workdir, "--timeout", INSTALL_TIMEOUT
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm install failed: {done.stdout}{done.stderr}")
    wait_for(lambda: all_ready(node.kube, NAMESPACE, FULLNAME, SELECTOR), READY_SECONDS,
             "both replicas Ready")  # fmt: skip
    log.info("helm install --wait: %.1fs", seconds)
    client = write_secret_files(secrets[f"{FULLNAME}-client-tls"], workdir / "ca-client")
    return Installed(seconds, client)


def _round(node: RealNode) -> list[dict[str, Any]]:
    """One sample of each replica's container, with its role at that moment."""
    pods = live_pods(node.core(), NAMESPACE, SELECTOR)
    leader = lease_holder(node.kube, NAMESPACE, FULLNAME)
    kubelet = sample.kubelet_working_sets(node)
    rows = []
    for container in sample.containers(node, pods):
        figures = asdict(sample.sample(container, kubelet))
        figures["role"] = "leader" if container.pod == leader else "standby"
        figures["t"] = time.monotonic()
        rows.append(figures)
    return rows


def _sample_for(node: RealNode, seconds: float, period: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows += _round(node)
        time.sleep(period)
    return rows


def _populate(node: RealNode, emulator: GatewayEmulator, count: int) -> None:
    """`count` running servers of the group in the emulator, and a Ready kwok Node for each."""
    body = {"count": count, "tags": {TAG_CLUSTER: CLUSTER, TAG_GROUP: GROUP}, "flavor": FLAVOR,
            "image": IMAGE, "zone": ZONE, "status": "running",
            "name_prefix": f"{CLUSTER}-{GROUP}"}  # fmt: skip
    response = httpx.post(f"{emulator.admin_url}/populate", json=body, timeout=120)
    response.raise_for_status()
    uuids: list[str] = response.json()["uuids"]
    names = {f"node-{u}": f"cloudscale://{u}" for u in uuids}
    core = kubenodes.api(node.kube)
    started = time.monotonic()
    kubenodes.register(core, names, KWOK_NODES)
    wait_for(lambda: not kubenodes.not_ready(core, names, KWOK_NODES),
             REGISTER_READY_SECONDS, f"{count} kwok Nodes Ready", period=0.5)  # fmt: skip
    log.info("%d servers and Ready Nodes: %.0fs", count, time.monotonic() - started)


def _start_ca(
    node: RealNode, plan: NodeMemoryPlan, client: Path, workdir: Path
) -> tuple[Autoscaler, str]:
    """CA on this host with the chart's cloud-config: it dials the Service by its name, which
    its own /etc/hosts maps to the ClusterIP; kube-proxy takes it to the leader."""
    core = node.core()
    chart_config: Any = core.read_namespaced_config_map(f"{FULLNAME}-cloud-config", NAMESPACE)
    cloud_config = yaml.safe_load(chart_config.data["cloud-config"])
    for key, name in (("cert", "tls.crt"), ("key", "tls.key"), ("cacert", "ca.crt")):
        cloud_config[key] = str(client / name)
    path = workdir / "cloud-config.yaml"
    path.write_text(yaml.safe_dump(cloud_config))
    service: Any = core.read_namespaced_service(FULLNAME, NAMESPACE)
    port = free_port()
    argv = [*flags(plan.scan_interval_s), f"--address=127.0.0.1:{port}",
            f"--namespace={NAMESPACE}"]  # fmt: skip
    server_name = cloud_config["address"].rpartition(":")[0]
    ca = run_autoscaler(plan.ca_version, node.kube.admin_kubeconfig, path, workdir / "ca.log",
                        argv, hosts={service.spec.cluster_ip: [server_name]})  # fmt: skip
    return ca, f"http://127.0.0.1:{port}/metrics"


def _ca_scrape(url: str) -> Scrape | None:
    try:
        return scrape(url)
    except OSError:
        return None  # not listening yet


def _loops(url: str) -> int:
    current = _ca_scrape(url)
    return 0 if current is None else int(current.value(FUNCTION_COUNT, function="main"))


def _our_rpcs(node: RealNode) -> float:
    """The gRPC requests both replicas have answered so far (their /metrics on the Pod IPs)."""
    total = 0.0
    for pod in live_pods(node.core(), NAMESPACE, SELECTOR):
        ours = scrape(f"http://{pod.status.pod_ip}:{METRICS_PORT}/metrics")
        total += ours.value(OUR_REQUESTS)
    return total


def _under_ca(
    node: RealNode, plan: NodeMemoryPlan, installed: Installed, workdir: Path
) -> dict[str, Any]:
    """Samples from the end of CA's first loop to the end of `plan.loops` more."""
    ca, metrics = _start_ca(node, plan, installed.client, workdir)
    try:
        started = time.monotonic()
        _wait_loop(ca, metrics, 1, plan.loop_timeout_s)
        first_loop_s = time.monotonic() - started
        rpcs_before = _our_rpcs(node)
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + plan.loop_timeout_s
        while (seen := _loops(metrics)) < 1 + plan.loops:
            ca.alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"CA's loop {seen + 1} did not end: {ca.complaints()}")
            rows += _round(node)
            time.sleep(plan.sample_period_s)
        last = _ca_scrape(metrics)
        assert last is not None
        return {
            "samples": rows,
            "first_loop_s": first_loop_s,
            "our_rpcs": _our_rpcs(node) - rpcs_before,
            "ca_nodes": {k: v for k, v in last.by_label(CA_NODES, "state").items() if v},
            "ca_errors": {k: v for k, v in last.by_label(CA_ERRORS, "type").items() if v},
        }
    finally:
        ca.stop()


def _wait_loop(ca: Autoscaler, metrics: str, loops: int, limit: float) -> None:
    deadline = time.monotonic() + limit
    while _loops(metrics) < loops:
        ca.alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"CA's first loop did not end in {limit:.0f}s: {ca.complaints()}")
        time.sleep(1.0)
