"""The real node (tests/fixtures/node.py): a kubelet, containerd and kube-proxy on this machine
run what the chart's Pods will need. The Node goes Ready; a Pod's readiness follows the
kubelet's own probe both ways; a ClusterIP Service reaches its Pod through kube-proxy from the
host and from another Pod; a Pod reaches this host but nothing beyond it; the project's image,
imported into containerd, runs as a Job and talks to the API server with in-cluster config.

Then the provider itself, from that image, as users deploy it (fixtures/deployed.py): the
image and the chart pushed to a registry on loopback (fixtures/registry.py), helm 4's `helm
install --wait` of the chart from there with two replicas and the image pulled by digest
becomes Ready by the kubelet's probes (and installs whose config `serve` refuses, whose cloud
never answers, or whose readiness is the old leader-only one fail helm 4's own wait; helm 3's
passes the last one); helm 3 installs and upgrades it too; the real Cluster Autoscaler on this
host reaches it through the gRPC Service's ClusterIP, scales up from zero and down, and loses
or doubles nothing when the leader's Pod is deleted during a scale-up; `helm upgrade` reloads
or rolls the Pods (a setting only a restart applies rolls them) and `helm rollback` rolls them
back, while the Service keeps answering; the PodDisruptionBudget refuses evicting both; the
kustomize base rolls out.

Every test that needs the real node is here: one node per machine, and pytest-xdist hands a
module to one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fixtures.autoscaler import Autoscaler, run_autoscaler
from fixtures.cluster import condition_true, running_kwok
from fixtures.deployed import (
    CHART,
    KUSTOMIZE_BASE,
    ChartSource,
    ClientFiles,
    EmulatorView,
    GatewayEmulator,
    ServiceProbe,
    all_ready,
    apply,
    certificates,
    create_secrets,
    create_unless_exists,
    helm,
    helm_install,
    lease_holder,
    live_pods,
    readyz,
    rendered,
    running_emulator,
    slice_pods,
    token_secret,
    wait_for,
    write_secret_files,
)
from fixtures.node import NEEDS_NODE, RealNode
from fixtures.registry import Registry
from fixtures.stack import wait_until
from fixtures.tools import HELM, HELM4, KUSTOMIZE, GoTool, ensure, free_port
from kubernetes import client as k8s
from kubernetes.stream import stream
from test_ca_real import (
    CA_FLAGS,
    KUBELET_USER_DATA,
    kubelets,
    load,
    load_pods,
    scale_up_events,
    wait_all_running,
    wait_answered_and_creating,
)

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER
from cloudscale_autoscaler.transport.certs import Issued, mint_ca

pytestmark = [pytest.mark.kube, pytest.mark.node, NEEDS_NODE]

NAMESPACE = "smoke"
POD_LIMIT_SECONDS = 60.0
# The readiness probes below: every second, one failure or success flips the condition.
PROBE = {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1}
# A probe that starts failing is seen within its period; the kubelet then updates the status.
NOT_READY_LIMIT_SECONDS = 10.0
# The manifests' container security context (deploy/): the image must run under it.
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
# In-cluster config from the image's own Python: who the API server says the Pod is.
WHOAMI = """
from kubernetes import client, config
config.load_incluster_config()
review = client.AuthenticationV1Api().create_self_subject_review(
    {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
print("user:", review.status.user_info.username)
"""


@pytest.fixture(scope="module")
def namespace(real_node: RealNode) -> str:
    return real_node.namespace(NAMESPACE)


@pytest.fixture(scope="module")
def project_image(real_node: RealNode, image: str) -> Iterator[str]:
    """The project's image (fixtures/image.py), imported into the node's containerd."""
    seconds = real_node.import_image(image)
    real_node.timings["project image import"] = seconds
    yield image


def busybox_pod(node: RealNode, name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A Pod running `script` with busybox's sh; `spec` adds to the container (probes, env)."""
    labels = spec.pop("labels", {"app": name})
    restart = spec.pop("restart", "Always")
    container = {
        "name": name,
        "image": node.busybox_image,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", script],
        **spec,
    }
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [container],
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 0,
        },
    }


def wait_pod(
    core: k8s.CoreV1Api,
    name: str,
    check: Callable[[Any], bool],
    what: str,
    limit: float = POD_LIMIT_SECONDS,
) -> Any:
    """The Pod once `check(pod)` holds; fails with its status and events otherwise."""
    deadline = time.monotonic() + limit
    while True:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        if check(pod):
            return pod
        if time.monotonic() > deadline:
            events = core.list_namespaced_event(
                NAMESPACE, field_selector=f"involvedObject.name={name}"
            )
            messages = [f"{e.reason}: {e.message}" for e in events.items]
            pytest.fail(
                f"{name}: not {what} within {limit:.0f}s; status {pod.status}; events {messages}"
            )
        time.sleep(0.1)


def pod_log(core: k8s.CoreV1Api, name: str, namespace: str, **options: Any) -> str:
    """A Pod's log as text (the kubernetes client 36 returns the bytes' repr otherwise)."""
    response = core.read_namespaced_pod_log(name, namespace, _preload_content=False, **options)
    return str(response.data.decode(errors="replace"))


def ready(pod: Any) -> bool:
    return condition_true(pod.status, "Ready")


def not_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "False" for c in pod.status.conditions or [])


def finished(pod: Any) -> bool:
    return pod.status.phase in ("Succeeded", "Failed")


def exec_in(node: RealNode, name: str, *argv: str) -> str:
    """Run `argv` in the Pod's container (API server -> kubelet -> containerd)."""
    # Its own client: stream() replaces the client's request method while it runs.
    api = k8s.CoreV1Api(node.kube.client())
    output: str = stream(
        api.connect_get_namespaced_pod_exec,
        name,
        NAMESPACE,
        command=list(argv),
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    return output


def test_node_ready(real_node: RealNode) -> None:
    """The kubelet registered the Node at the gateway address, with containerd, and it is
    Ready; no kwok annotation: it is the real one."""
    node = real_node.core().read_node(real_node.name)
    assert condition_true(node.status, "Ready"), node.status.conditions
    addresses = {a.type: a.address for a in node.status.addresses}
    assert addresses["InternalIP"] == real_node.gateway
    assert node.status.node_info.kubelet_version == real_node.kube.version
    assert node.status.node_info.container_runtime_version.startswith("containerd://")
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    print(f"real node timings: {real_node.timings}")


def test_readiness_follows_the_kubelets_probe(real_node: RealNode, namespace: str) -> None:
    """Ready only once the kubelet's HTTP probe answers; NotReady once it fails (the file it
    asks for removed inside the container); Ready again once it answers again."""
    core = real_node.core()
    probe = {"httpGet": {"path": "/ready", "port": 8080}, **PROBE}
    script = "mkdir -p /www && echo ok > /www/ready && exec httpd -f -p 8080 -h /www"
    created = time.monotonic()
    core.create_namespaced_pod(
        namespace, busybox_pod(real_node, "probed", script, readinessProbe=probe)
    )
    pod = wait_pod(core, "probed", ready, "Ready")
    real_node.timings["pod ready"] = time.monotonic() - created
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(real_node.pod_cidr)

    exec_in(real_node, "probed", "rm", "/www/ready")
    failing = time.monotonic()
    wait_pod(core, "probed", not_ready, "NotReady", NOT_READY_LIMIT_SECONDS)
    real_node.timings["probe failing -> NotReady"] = time.monotonic() - failing
    assert core.read_namespaced_pod("probed", namespace).status.phase == "Running"

    exec_in(real_node, "probed", "sh", "-c", "echo ok > /www/ready")
    wait_pod(core, "probed", ready, "Ready again", NOT_READY_LIMIT_SECONDS)


def test_never_ready_pod_stays_not_ready(real_node: RealNode, namespace: str) -> None:
    """A probe that never succeeds keeps the Pod NotReady though its container runs: Ready
    above comes from the probe, not from the container starting."""
    core = real_node.core()
    probe = {"httpGet": {"path": "/missing", "port": 8080}, **PROBE}
    script = "mkdir -p /www && exec httpd -f -p 8080 -h /www"
    core.create_namespaced_pod(
        namespace, busybox_pod(real_node, "unready", script, readinessProbe=probe)
    )
    wait_pod(core, "unready", lambda p: _running(p) and not_ready(p), "running and NotReady")
    time.sleep(3)  # three probe periods
    assert not_ready(core.read_namespaced_pod("unready", namespace))


def _running(pod: Any) -> bool:
    return any(s.state.running for s in pod.status.container_statuses or [])


def test_cluster_ip_reaches_the_pod(real_node: RealNode, namespace: str) -> None:
    """A ClusterIP Service answers with its Pod's page from the host and from another Pod
    (kube-proxy's iptables rules, no masquerading out of the machine)."""
    core = real_node.core()
    script = (
        'mkdir -p /www && echo "served by $POD_NAME" > /www/index.html && '
        "exec httpd -f -p 8080 -h /www"
    )
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    probe = {"tcpSocket": {"port": 8080}, **PROBE}
    web = busybox_pod(real_node, "web", script, env=env, readinessProbe=probe)
    core.create_namespaced_pod(namespace, web)
    service = core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    cluster_ip = service.spec.cluster_ip
    wait_pod(core, "web", ready, "Ready")

    assert _get_when_served(f"http://{cluster_ip}/") == "served by web\n"

    client = busybox_pod(real_node, "web-client", http_get(cluster_ip, 80), restart="Never")
    core.create_namespaced_pod(namespace, client)
    pod = wait_pod(core, "web-client", finished, "finished")
    log = pod_log(core, "web-client", namespace)
    assert pod.status.phase == "Succeeded", log
    assert log.splitlines()[-1] == "served by web"


def http_get(host: str, port: int, timeout: int = 5) -> str:
    """A shell command printing an HTTP GET's response (busybox-static's wget crashes here; its
    nc does not), failing if nothing connects within `timeout` seconds."""
    return f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w {timeout} {host} {port}"


def _get_when_served(url: str) -> str:
    """The page, once kube-proxy has programmed the Service (a sync after the Pod is Ready)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return httpx.get(url, timeout=2).raise_for_status().text
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class _HostPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"this host\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def host_server(real_node: RealNode) -> Iterator[int]:
    """An HTTP server of this host on the gateway address (where the emulator would listen for
    the chart's Pods); its port."""
    server = http.server.ThreadingHTTPServer((real_node.gateway, 0), _HostPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_pods_cannot_leave_the_machine(
    real_node: RealNode, namespace: str, host_server: int
) -> None:
    """From a Pod, a server of this host on the gateway answers; an address outside the
    machine does not, within nc's 2 s, and the node's egress rule counted the attempt."""
    core = real_node.core()
    script = (
        f"echo host:$({http_get(real_node.gateway, host_server, 2)} 2>/dev/null | tail -n 1); "
        f"if {http_get('1.1.1.1', 443, 2)} 2>/dev/null; then echo outside:reached; "
        "else echo outside:blocked; fi"
    )
    dropped = real_node.dropped_packets()
    core.create_namespaced_pod(namespace, busybox_pod(real_node, "egress", script, restart="Never"))
    pod = wait_pod(core, "egress", finished, "finished")
    log = pod_log(core, "egress", namespace)
    assert pod.status.phase == "Succeeded", log
    assert log.splitlines() == ["host:this host", "outside:blocked"]
    assert real_node.dropped_packets() > dropped


def test_project_image_runs(real_node: RealNode, namespace: str, project_image: str) -> None:
    """The image users deploy, imported into containerd, runs under the manifests' security
    context: `--help` as a Job that completes, and its Python reaches the API server through
    the `kubernetes` Service with in-cluster config, as the Pod's service account."""
    core, batch = real_node.core(), k8s.BatchV1Api(real_node.kube.client())
    container = {
        "name": "help",
        "image": project_image,
        "imagePullPolicy": "Never",
        "args": ["--help"],
        "securityContext": RESTRICTED,
    }
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "help"},
            "spec": {
                "backoffLimit": 0,
                "template": {"spec": {"containers": [container], "restartPolicy": "Never"}},
            },
        },
    )
    whoami = {
        "name": "whoami",
        "image": project_image,
        "imagePullPolicy": "Never",
        "command": ["python", "-c", WHOAMI],
        "securityContext": RESTRICTED,
    }
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "whoami"},
            "spec": {"containers": [whoami], "restartPolicy": "Never"},
        },
    )

    _wait_job_complete(batch, "help")
    (help_pod,) = core.list_namespaced_pod(namespace, label_selector="job-name=help").items
    help_log = pod_log(core, help_pod.metadata.name, namespace)
    assert "usage: cloudscale-autoscaler" in help_log
    assert "serve" in help_log

    pod = wait_pod(core, "whoami", finished, "finished")
    log = pod_log(core, "whoami", namespace)
    assert pod.status.phase == "Succeeded", log
    assert log.strip() == f"user: system:serviceaccount:{namespace}:default"


def _wait_job_complete(batch: k8s.BatchV1Api, name: str) -> None:
    deadline = time.monotonic() + POD_LIMIT_SECONDS
    while not condition_true(batch.read_namespaced_job(name, NAMESPACE).status, "Complete"):
        job = batch.read_namespaced_job(name, NAMESPACE)
        assert not condition_true(job.status, "Failed"), job.status
        assert time.monotonic() < deadline, f"Job {name} not complete: {job.status}"
        time.sleep(0.2)


# --- the chart and the kustomize base on the real node ---------------------------------------
#
# The provider as users deploy it, from the image built above: `helm install --wait` with two
# replicas and leader election, certificates in the Secrets cert-manager writes (issued here:
# no cert-manager controller runs), the token Secret, and the config pointed at the emulator on
# the gateway. One install serves the scenarios after it: the real CA on this host through the
# gRPC Service's ClusterIP, a failover by `kubectl delete pod`, a `helm upgrade`, evictions.

SYSTEM = "kube-system"  # where CA runs, so where its provider's objects are
RELEASE = "csa"
FULLNAME = f"{RELEASE}-cloudscale-autoscaler"
RELEASE_PODS = f"app.kubernetes.io/instance={RELEASE}"
CLUSTER_TAG = "real-node"
CA_VERSION = "1.36.1"
INSTALL_LIMIT_SECONDS = 180
_CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
CHART_VERSION, CHART_APP_VERSION = str(_CHART_YAML["version"]), str(_CHART_YAML["appVersion"])
# The chart's leader election (its defaults): the Service follows a new leader within
# leaseDuration plus a few seconds (docs/deployment.md). A deleted, evicted or rolled leader
# gets SIGTERM and releases the Lease, so the other replica serves within a retryPeriod (2 s)
# or so: the tests hold the handover to less than a leaseDuration, which a Lease left to
# expire (a leader killed without SIGTERM) cannot meet.
LEASE_SECONDS = 15
ROUTE_BOUND_SECONDS = LEASE_SECONDS + 5
HANDOVER_LIMIT_SECONDS = LEASE_SECONDS
LOAD_PODS = 3
MAX_SIZE = 5
# Emulated servers' Nodes (kwok's) carry the group's label and taint: the load selects the
# label, which the real node lacks, and tolerates the taint, which keeps the provider's own
# Pods (and anything else) off those Nodes.
POOL = {"pool": "emulated"}
POOL_TAINT = {"key": "pool", "value": "emulated", "effect": "NoSchedule"}
LOAD_PLACEMENT = {"nodeSelector": POOL, "tolerations": [{**POOL_TAINT, "operator": "Equal"}]}


def group(**fields: Any) -> dict[str, Any]:
    """The node group: its Nodes (kwok's here) get its label and taint from the user data."""
    return {"name": "workers", "minSize": 0, "maxSize": MAX_SIZE, "flavor": "flex-4-2",
            "image": "debian-12", "zone": "lpg1", "labels": POOL, "taints": [POOL_TAINT],
            "userData": KUBELET_USER_DATA, **fields}  # fmt: skip


@dataclass(frozen=True)
class Published:
    """The image and the packaged chart in the loopback registry, as a release publishes
    them: the image's repository and manifest digest, and the chart's OCI reference."""

    repository: str
    digest: str
    chart: ChartSource


def chart_values(published: Published, cloud_url: str, pod_cidr: str) -> dict[str, Any]:
    """What a user sets: the image by its digest (pulled from the registry, as a signature
    covers it), no cert-manager, the cloud API (the emulator), a node group, the Pod network
    for the route's admission policy. ScheduleAnyway: the one node the replicas can use has
    the tainted Nodes of emulated servers beside it, which DoNotSchedule counts as places for
    a replica too (nodeTaintsPolicy Ignore), so a replica replacing one would stay Pending.
    ScheduleAnyway keeps the chart's spreading as a preference; `enabled: false` would drop
    it."""
    return {
        "image": {"repository": published.repository, "digest": published.digest,
                  "pullPolicy": "IfNotPresent"},
        "certManager": {"enabled": False},
        "topologySpread": {"whenUnsatisfiable": "ScheduleAnyway"},
        "kubernetes": {"leaderElection": {"podCIDRs": [pod_cidr]}},
        "config": {"cluster": CLUSTER_TAG, "cloudscale": {"url": cloud_url},
                   "nodeGroups": [group()]},
    }  # fmt: skip


@dataclass
class Release:
    """The module's install and what CA needs to reach it."""

    values: dict[str, Any]
    install_seconds: float  # helm install --wait
    ready_seconds: float  # helm install started -> both Pods Ready
    secrets: dict[str, dict[str, Any]]
    address: str  # the cloud-config's: <Service name>:<port>
    cluster_ip: str

    @property
    def server_name(self) -> str:
        return self.address.rpartition(":")[0]

    def probe(self, client: ClientFiles) -> ServiceProbe:
        port = self.address.rpartition(":")[2]
        return ServiceProbe(f"{self.cluster_ip}:{port}", self.server_name, client)


@pytest.fixture(scope="module")
def gateway_emulator(real_node: RealNode) -> Iterator[GatewayEmulator]:
    with running_emulator(real_node.gateway, real_node.directory) as running:
        yield running


@pytest.fixture(scope="module")
def provider_ca() -> Issued:
    """The private CA cert-manager's CA Issuer would hold."""
    return mint_ca("cloudscale-autoscaler test CA")


@pytest.fixture(scope="module")
def published(
    real_node: RealNode, image: str, registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> Published:
    """The project's image pushed to the registry (podman push) and the chart packaged and
    pushed there (helm 4 package, helm push); containerd told it may pull from it."""
    started = time.monotonic()
    digest = registry.push_image(image, "cloudscale-autoscaler", CHART_APP_VERSION)
    real_node.timings["image pushed to the registry"] = time.monotonic() - started
    directory = tmp_path_factory.mktemp("chart")
    packaged = helm(real_node.kube, "package", str(CHART), "--destination", str(directory))
    assert packaged.returncode == 0, packaged.stderr
    (archive,) = directory.glob("*.tgz")
    charts = f"oci://{registry.reference('charts')}"
    pushed = helm(real_node.kube, "push", str(archive), charts, "--plain-http")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    real_node.trust_registry(registry.host)
    source = ChartSource(f"{charts}/cloudscale-autoscaler",
                         ("--version", CHART_VERSION, "--plain-http"))  # fmt: skip
    return Published(registry.reference("cloudscale-autoscaler"), digest, source)


@pytest.fixture(scope="module")
def release(
    real_node: RealNode,
    published: Published,
    gateway_emulator: GatewayEmulator,
    provider_ca: Issued,
    tmp_path_factory: pytest.TempPathFactory,
) -> Release:
    """The chart installed from the registry with helm 4's `helm install --wait` into
    kube-system, its image pulled by digest."""
    values = chart_values(published, gateway_emulator.url, real_node.pod_cidr)
    directory = tmp_path_factory.mktemp("release")
    done, seconds, secrets = helm_install(
        real_node.kube, RELEASE, SYSTEM, values, provider_ca, directory,
        "--timeout", f"{INSTALL_LIMIT_SECONDS}s", source=published.chart,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    both = wait_for(
        lambda: all_ready(real_node.kube, SYSTEM, FULLNAME, RELEASE_PODS), 60,
        "helm returned, but both replicas Ready",
    )  # fmt: skip
    core = real_node.core()
    cloud_config = core.read_namespaced_config_map(f"{FULLNAME}-cloud-config", SYSTEM)
    address = yaml.safe_load(cloud_config.data["cloud-config"])["address"]
    service = core.read_namespaced_service(FULLNAME, SYSTEM)
    real_node.timings["helm install --wait"] = seconds
    real_node.timings["helm install -> both Ready"] = seconds + both
    return Release(values, seconds, seconds + both, secrets, address, service.spec.cluster_ip)


@pytest.fixture(scope="module")
def ca_client(release: Release, tmp_path_factory: pytest.TempPathFactory) -> ClientFiles:
    """CA's client certificate Secret, as the files CA mounts."""
    secret = release.secrets[f"{FULLNAME}-client-tls"]
    return ClientFiles(write_secret_files(secret, tmp_path_factory.mktemp("ca-client")))


def provider_pods(node: RealNode) -> list[Any]:
    return live_pods(node.core(), SYSTEM, RELEASE_PODS)


def test_helm_install_waits_for_two_ready_replicas(
    real_node: RealNode, release: Release, published: Published, ca_client: ClientFiles
) -> None:
    """helm 4's `helm install --wait` of the chart from the registry returned, containerd
    pulled the image by digest, and both Pods are Ready by the kubelet's probes of the
    real processes, on the real node: one answers /readyz as the leader, the other as its
    standby. The EndpointSlice lists the leader alone, and through the Service's ClusterIP,
    under the certificate's DNS name, the leader answers CA's first call."""
    assert release.install_seconds < INSTALL_LIMIT_SECONDS
    pods = provider_pods(real_node)
    assert len(pods) == 2 and all(map(ready, pods)), [p.status for p in pods]
    assert {pod.spec.node_name for pod in pods} == {real_node.name}
    # containerd pulled the image from the registry, by the digest the chart names.
    image = f"{published.repository}@{published.digest}"
    for pod in pods:
        [status] = pod.status.container_statuses
        assert pod.spec.containers[0].image == image
        assert status.image_id.endswith(published.digest), status.image_id
    leader = lease_holder(real_node.kube, SYSTEM, FULLNAME)
    answers = {pod.metadata.name: readyz(pod) for pod in pods}
    assert answers.pop(leader) == "ready: leader", answers
    [standby] = (pod for pod in pods if pod.metadata.name != leader)
    standby_answer = answers[standby.metadata.name]
    assert standby_answer.startswith("ready: this replica is a standby"), standby_answer
    # The standby names the leader once it has read the Lease since the leader took it (its
    # next try, a retryPeriod later); until then it says that no leader is known yet.
    wait_for(lambda: leader in readyz(standby), 10, f"the standby naming {leader}")
    wait_for(lambda: slice_pods(real_node.kube, SYSTEM, FULLNAME) == [leader], 30,
             "the EndpointSlice listing the leader alone")  # fmt: skip
    # kube-proxy programs the endpoint a moment after the leader wrote it.
    probe = release.probe(ca_client)
    wait_for(lambda: probe.call() == {"workers": MAX_SIZE}, 10, "the leader answering CA")
    print(f"helm install --wait {release.install_seconds:.1f}s, both Ready after "
          f"{release.ready_seconds:.1f}s")  # fmt: skip


# Installs that must not count as installed: a helm --wait timeout short for them but several
# times what the good install takes here; each is observed this long after it started, then removed.
RED_TIMEOUT = "30s"
RED_OBSERVED_SECONDS = 40.0
# The chart 0.1.x way: only the leader Ready (its /readyz body says so), the standby never.
LEADER_ONLY_PROBE = {
    "exec": {"command": ["python", "-c", (
        "import sys, urllib.request\n"
        "body = urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2).read()\n"
        "sys.exit(0 if body.startswith(b'ready: leader') else 1)"
    )]},
    "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2,
}  # fmt: skip
POST_RENDERER = """#!{python}
# Replaces the provider's readiness probe in the rendered chart (helm --post-renderer: helm 3
# runs this file, helm 4 the plugin POST_RENDERER_PLUGIN names).
import json, sys, yaml
docs = [doc for doc in yaml.safe_load_all(sys.stdin) if doc]
for doc in docs:
    if doc["kind"] == "Deployment":
        doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = json.loads({probe!r})
yaml.safe_dump_all(docs, sys.stdout)
"""


# helm 4 runs post-renderers only as plugins (type postrenderer/v1), found in HELM_PLUGINS.
POST_RENDERER_PLUGIN = """name: {name}
version: 0.1.0
type: postrenderer/v1
apiVersion: v1
runtime: subprocess
runtimeConfig:
  platformCommand:
    - command: {script}
"""


@dataclass(frozen=True)
class Red:
    """An install that cannot become what the install test asks: its values on top of the
    good install's, or a post-renderer's probe; helm's own timeout; the helm it runs."""

    release: str
    values: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    timeout: str = RED_TIMEOUT
    client: GoTool = HELM4


RED = {
    # The loader knows the five placeholders of userData; neither the schema nor the
    # templates check them (docs/deployment.md, "What the chart cannot check").
    "serve refuses its config": Red(
        "refused",
        {"config": {"nodeGroups": [group(userData=KUBELET_USER_DATA + "# ${bogus}\n")]}},
    ),
    # Ready means the cloud API answered: nothing listens at this URL.
    "the cloud never answers": Red("unanswered", {"config": {"cloudscale": {"url": None}}}),
    # helm 4 waits with kstatus: a Deployment is ready when every replica is available.
    "only the leader is Ready": Red("leaderonly", probe=LEADER_ONLY_PROBE),
    # helm 3 counts a Deployment ready at replicas - maxUnavailable Ready Pods: 1 here, so it
    # returns; a longer timeout keeps a slow start from failing it.
    "only the leader is Ready, helm 3": Red(
        "leaderonly3", probe=LEADER_ONLY_PROBE, timeout="90s", client=HELM
    ),
}


@dataclass
class RedOutcome:
    helm: subprocess.CompletedProcess[str]
    all_ready: bool  # the install test's own check: every replica Ready, rolled out
    pods: list[Any]
    leader: str
    logs: dict[str, str]  # each Pod's container logs
    readyz: dict[str, str]


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = deep_merge(base[key], value) if both else value
    return merged


def red_install(
    node: RealNode, red: Red, values: dict[str, Any], ca: Issued, directory: Path
) -> RedOutcome:
    """Install `red` into a namespace of its own, watch it until RED_OBSERVED_SECONDS, note
    what it became, uninstall it."""
    namespace = node.namespace(f"red-{red.release}")
    started = time.monotonic()
    args = ["--timeout", red.timeout]
    env: dict[str, str] = {}
    if red.probe is not None:
        renderer = directory / f"{red.release}-post-renderer"
        script = POST_RENDERER.format(python=sys.executable, probe=json.dumps(red.probe))
        renderer.write_text(script)
        renderer.chmod(0o755)
        if red.client == HELM4:
            plugin = directory / f"{red.release}-plugins" / red.release
            plugin.mkdir(parents=True)
            (plugin / "plugin.yaml").write_text(
                POST_RENDERER_PLUGIN.format(name=red.release, script=renderer)
            )
            env["HELM_PLUGINS"] = str(plugin.parent)
            args += ["--post-renderer", red.release]
        else:
            args += ["--post-renderer", str(renderer)]
    done, _, _ = helm_install(node.kube, red.release, namespace, values, ca, directory, *args,
                              client=red.client, env=env)  # fmt: skip
    time.sleep(max(0.0, RED_OBSERVED_SECONDS - (time.monotonic() - started)))
    outcome = observe(node, namespace, red.release, done)
    helm(node.kube, "uninstall", red.release, "--namespace", namespace, "--wait",
         client=red.client)  # fmt: skip
    return outcome


def observe(
    node: RealNode, namespace: str, release: str, done: subprocess.CompletedProcess[str]
) -> RedOutcome:
    core, fullname = node.core(), f"{release}-cloudscale-autoscaler"
    selector = f"app.kubernetes.io/instance={release}"
    pods = live_pods(core, namespace, selector)
    logs, answers = {}, {}
    for pod in pods:
        name = pod.metadata.name
        logs[name] = container_logs(core, namespace, name)
        with contextlib.suppress(httpx.HTTPError):
            answers[name] = readyz(pod)
    try:
        leader = lease_holder(node.kube, namespace, fullname)
    except k8s.ApiException:
        leader = ""  # no replica ever led
    complete = all_ready(node.kube, namespace, fullname, selector)
    return RedOutcome(done, complete, pods, leader, logs, answers)


def container_logs(core: k8s.CoreV1Api, namespace: str, name: str) -> str:
    """The Pod's container logs, the last run's and the one before (a crash-looping container
    may be between the two: either can be gone or not started yet)."""
    found = []
    for previous in (True, False):
        with contextlib.suppress(k8s.ApiException):
            found.append(pod_log(core, name, namespace, previous=previous))
    return "".join(found)


@pytest.fixture(scope="module")
def red_outcomes(
    real_node: RealNode,
    published: Published,
    gateway_emulator: GatewayEmulator,
    provider_ca: Issued,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, RedOutcome]:
    """Every RED install at once (each waits out its timeout: one after the other would
    take four times as long)."""
    directory = tmp_path_factory.mktemp("red")
    good = chart_values(published, gateway_emulator.url, real_node.pod_cidr)
    unanswered = f"http://{real_node.gateway}:{free_port()}/v1"  # nothing listens there
    with ThreadPoolExecutor(len(RED)) as pool:
        futures = {}
        for name, red in RED.items():
            values = deep_merge(good, red.values)
            if values["config"]["cloudscale"]["url"] is None:
                values["config"]["cloudscale"]["url"] = unanswered
            futures[name] = pool.submit(red_install, real_node, red, values, provider_ca, directory)
        return {name: future.result() for name, future in futures.items()}


def helm_failed(outcome: RedOutcome) -> str:
    """helm 4's own verdict: the Deployment not ready (kstatus) when its timeout ran out."""
    output = outcome.helm.stdout + outcome.helm.stderr
    assert outcome.helm.returncode != 0, output
    assert "context deadline exceeded" in output, output
    assert "Deployment/" in output and "not ready" in output, output
    return output


def test_an_install_whose_config_serve_refuses_fails(red_outcomes: dict[str, RedOutcome]) -> None:
    """A value the chart's schema lets through and `serve` refuses: the containers exit at
    start, helm install --wait fails at its timeout, and the log names the value."""
    outcome = red_outcomes["serve refuses its config"]
    helm_failed(outcome)
    assert not outcome.all_ready
    for pod in outcome.pods:
        [status] = pod.status.container_statuses
        assert status.restart_count > 0 and not status.ready, status
    refusal = "unknown placeholder ${bogus}"
    assert any(refusal in log for log in outcome.logs.values()), outcome.logs


def test_an_install_whose_cloud_never_answers_fails(red_outcomes: dict[str, RedOutcome]) -> None:
    """`serve` runs (no restarts) but is never Ready: the cloud API never answered. helm
    install --wait fails at its timeout."""
    outcome = red_outcomes["the cloud never answers"]
    helm_failed(outcome)
    assert not outcome.all_ready
    assert len(outcome.pods) == 2 and not any(map(ready, outcome.pods))
    for pod in outcome.pods:
        assert pod.status.container_statuses[0].restart_count == 0
    assert all(body.startswith("not ready") for body in outcome.readyz.values()), outcome.readyz


def test_leader_only_readiness_fails_helm_4s_wait(red_outcomes: dict[str, RedOutcome]) -> None:
    """The old leader-only readiness: helm 4 waits with kstatus, which counts every replica
    (available replicas below spec.replicas: InProgress), so its own `--wait` fails at its
    timeout; the standby never became Ready."""
    outcome = red_outcomes["only the leader is Ready"]
    output = helm_failed(outcome)
    print(f"helm 4's verdict: {output.strip().splitlines()[-1]}")
    assert "InProgress" in output, output
    assert not outcome.all_ready
    readiness = {pod.metadata.name: ready(pod) for pod in outcome.pods}
    assert readiness == {name: name == outcome.leader for name in readiness}, readiness


def test_leader_only_readiness_passes_helm_3_but_fails_the_install_check(
    red_outcomes: dict[str, RedOutcome],
) -> None:
    """helm 3's `--wait` returns (it needs replicas - maxUnavailable = 1 Ready Pod), but the
    standby is never Ready, so the rollout never completes and the install test's own check
    fails, as it must."""
    outcome = red_outcomes["only the leader is Ready, helm 3"]
    assert outcome.helm.returncode == 0, outcome.helm.stdout + outcome.helm.stderr
    assert not outcome.all_ready
    readiness = {pod.metadata.name: ready(pod) for pod in outcome.pods}
    assert readiness == {name: name == outcome.leader for name in readiness}, readiness


def test_helm_3_installs_and_upgrades_the_chart(
    real_node: RealNode,
    published: Published,
    gateway_emulator: GatewayEmulator,
    provider_ca: Issued,
    tmp_path: Path,
) -> None:
    """helm 3 stays supported: `helm install --wait` of the chart from the registry, both
    replicas Ready, then `helm upgrade --wait` with a setting only a restart applies (new Pods,
    both Ready again); then uninstalled."""
    release, namespace = "csa3", real_node.namespace("helm3")
    fullname, selector = f"{release}-cloudscale-autoscaler", f"app.kubernetes.io/instance={release}"
    values = chart_values(published, gateway_emulator.url, real_node.pod_cidr)
    values["config"]["cluster"] = "helm3"
    done, _, _ = helm_install(
        real_node.kube, release, namespace, values, provider_ca, tmp_path,
        "--timeout", f"{INSTALL_LIMIT_SECONDS}s", source=published.chart, client=HELM,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: all_ready(real_node.kube, namespace, fullname, selector), 60,
             "helm 3's install: both replicas Ready")  # fmt: skip
    before = {p.metadata.name for p in live_pods(real_node.core(), namespace, selector)}
    path = tmp_path / "upgrade.yaml"
    path.write_text(yaml.safe_dump(deep_merge(values, {"config": {"gpuLabel": "example.com/gpu"}})))
    upgraded = helm(real_node.kube, "upgrade", release, published.chart.reference,
                    *published.chart.options, "--namespace", namespace, "-f", str(path),
                    "--wait", "--timeout", f"{INSTALL_LIMIT_SECONDS}s", client=HELM)  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    wait_for(lambda: all_ready(real_node.kube, namespace, fullname, selector), 60,
             "helm 3's upgrade: both replicas Ready")  # fmt: skip
    after = {p.metadata.name for p in live_pods(real_node.core(), namespace, selector)}
    assert not before & after, "a restart-only setting rolled the Pods"
    helm(real_node.kube, "uninstall", release, "--namespace", namespace, "--wait", client=HELM)


@pytest.fixture(scope="module")
def kwok(real_node: RealNode) -> Iterator[None]:
    """kwok, for the Nodes of emulated servers (the real node stays the kubelet's)."""
    with running_kwok(real_node.kube, real_node.directory):
        yield


@pytest.fixture(scope="module")
def autoscaler(
    real_node: RealNode,
    release: Release,
    ca_client: ClientFiles,
    kwok: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Autoscaler]:
    """The real CA on this host with the chart's cloud-config: it dials the Service by the name
    there, which its own /etc/hosts maps to the ClusterIP (no cluster DNS here), and verifies
    the server certificate against that name; kube-proxy takes the connection to the Pod the
    EndpointSlice lists."""
    directory = tmp_path_factory.mktemp("ca")
    core = real_node.core()
    chart_config = core.read_namespaced_config_map(f"{FULLNAME}-cloud-config", SYSTEM)
    cloud_config = yaml.safe_load(chart_config.data["cloud-config"])
    # The chart's cloud-config names where CA's Pod mounts the client Secret; here, its files.
    for key, name in (("cert", "tls.crt"), ("key", "tls.key"), ("cacert", "ca.crt")):
        cloud_config[key] = str(ca_client.directory / name)
    path = directory / "cloud-config.yaml"
    path.write_text(yaml.safe_dump(cloud_config))
    flags = (f"--address=127.0.0.1:{free_port()}", *CA_FLAGS, "--scale-down-unneeded-time=5s")
    ca = run_autoscaler(
        CA_VERSION, real_node.kube.admin_kubeconfig, path, directory / "ca.log", flags,
        hosts={release.cluster_ip: [release.server_name]},
    )  # fmt: skip
    try:
        yield ca
    finally:
        ca.stop()


@pytest.fixture
async def cloud(gateway_emulator: GatewayEmulator) -> AsyncIterator[EmulatorView]:
    """The gateway's emulator, with an admin client for this test's event loop."""
    view = EmulatorView(gateway_emulator.url, gateway_emulator.admin())
    try:
        yield view
    finally:
        await view.admin.aclose()


@contextlib.asynccontextmanager
async def stand_in(node: RealNode, cloud: EmulatorView) -> AsyncIterator[None]:
    """The CCM and kubelet stand-in (tests/test_ca_real.py): a kwok Node per running server."""
    task = asyncio.create_task(kubelets(node, cloud))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def our_servers(cloud: EmulatorView) -> list[dict[str, Any]]:
    servers = await cloud.admin.servers()
    return [s for s in servers if s["tags"].get(TAG_CLUSTER) == CLUSTER_TAG]


async def scale_load(node: RealNode, replicas: int) -> None:
    """The load Deployment at `replicas` (created the first time)."""
    apps = k8s.AppsV1Api(node.kube.client())
    try:
        await asyncio.to_thread(apps.read_namespaced_deployment, "load", "default")
    except k8s.ApiException:
        await load(node, replicas, **LOAD_PLACEMENT)
        return
    patch = {"spec": {"replicas": replicas}}
    await asyncio.to_thread(apps.patch_namespaced_deployment, "load", "default", patch)


async def wait_servers(cloud: EmulatorView, ca: Autoscaler, count: int, what: str) -> None:
    async def reached() -> bool:
        ca.alive()
        return len(await our_servers(cloud)) == count

    try:
        await wait_until(reached, 120, what)
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}; CA's last complaints:\n{ca.complaints()}") from None


async def test_ca_scales_up_from_zero_and_down_through_the_service(
    real_node: RealNode, autoscaler: Autoscaler, cloud: EmulatorView
) -> None:
    """Pending pods only a node of the group fits: CA asks our provider, through the gRPC
    Service, for a node each (0 -> 3), the pods run on the emulated servers' Nodes and none on
    the real node; two of them go, and CA deletes their idle nodes through it."""
    async with stand_in(real_node, cloud):
        await scale_load(real_node, LOAD_PODS)
        await wait_all_running(real_node, autoscaler, LOAD_PODS, "the load never ran")
        servers = {s["name"] for s in await our_servers(cloud)}
        assert len(servers) == LOAD_PODS
        assert f"workers 0->{LOAD_PODS} (max: {MAX_SIZE})" in autoscaler.output
        pods = await load_pods(real_node)
        assert {pod.spec.node_name for pod in pods} <= servers

        await scale_load(real_node, 1)
        await wait_servers(cloud, autoscaler, 1, "CA never deleted the idle nodes")
        assert "removing empty node" in autoscaler.output


@contextlib.asynccontextmanager
async def faults_cleared(cloud: EmulatorView) -> AsyncIterator[None]:
    """The emulator without faults afterwards, however the test ended (the module shares it)."""
    try:
        yield
    finally:
        await cloud.admin.clear_faults()


def routed_past(node: RealNode, leader: str) -> bool:
    """Another replica holds the Lease and the Service lists it alone. On SIGTERM the leader
    releases the Lease; the standby usually takes it, the Pod replacing the leader sometimes
    (it tries at once when it starts, the standby every retryPeriod): either serves."""
    holder = lease_holder(node.kube, SYSTEM, FULLNAME)
    return holder not in ("", leader) and slice_pods(node.kube, SYSTEM, FULLNAME) == [holder]


async def test_deleting_the_leader_pod_during_a_scale_up_doubles_nothing(
    real_node: RealNode,
    release: Release,
    ca_client: ClientFiles,
    autoscaler: Autoscaler,
    cloud: EmulatorView,
) -> None:
    """CA scales up by two while the API takes 8 s per create; once CA has our answer, the
    leader's Pod is deleted through the API (`kubectl delete pod`: SIGTERM). The leader
    releases the Lease, another replica takes it and the EndpointSlice within the documented
    bound, counts the creates in flight from the journal, and CA's pods are served with one
    server each: the scale-up planned once, nothing doubled."""
    before = len(await our_servers(cloud))
    target = before + 2
    await cloud.admin.set_faults({"latency": {"create_server": {"fixed_ms": 8000}}})
    earlier = await scale_up_events(real_node)
    async with stand_in(real_node, cloud), faults_cleared(cloud):
        await scale_load(real_node, target)
        await wait_answered_and_creating(real_node, autoscaler, cloud, earlier)
        leader = lease_holder(real_node.kube, SYSTEM, FULLNAME)
        replicas = {p.metadata.name for p in provider_pods(real_node)}
        with release.probe(ca_client) as probe:
            await asyncio.to_thread(real_node.core().delete_namespaced_pod, leader, SYSTEM)
            moved = await asyncio.to_thread(
                wait_for, lambda: routed_past(real_node, leader), ROUTE_BOUND_SECONDS,
                "the Lease and the Service moved off the deleted leader",
            )  # fmt: skip
            taker = lease_holder(real_node.kube, SYSTEM, FULLNAME)
            assert (await cloud.admin.in_flight()).get("create_server", 0) > 0, "took over late"
            await wait_all_running(real_node, autoscaler, target, "the load never ran")
        servers = await our_servers(cloud)
        assert len(servers) == target <= MAX_SIZE, [s["name"] for s in servers]
        assert autoscaler.output.count(f"workers {before}->{target} (max: {MAX_SIZE})") == 1
    gap = probe.longest_gap()
    successor = "the standby" if taker in replicas else "the leader's replacement"
    real_node.timings["leader deleted -> EndpointSlice"] = moved
    real_node.timings["leader deleted: longest unanswered"] = gap
    print(f"failover: {successor} in the EndpointSlice after {moved:.1f}s, longest unanswered "
          f"{gap:.1f}s ({probe.summary()})")  # fmt: skip
    assert gap < HANDOVER_LIMIT_SECONDS, probe.summary()


def ca_status_max_size(node: RealNode, group_name: str) -> int | None:
    """The maxSize CA's status ConfigMap shows for a group (what CA itself was told)."""
    status = node.core().read_namespaced_config_map("cluster-autoscaler-status", SYSTEM)
    groups = yaml.safe_load(status.data["status"]).get("nodeGroups") or []
    sizes = [g["health"]["maxSize"] for g in groups if g["name"] == group_name]
    return sizes[0] if sizes else None


# A setting only a restart applies, and one CA can read back through the Service (GPULabel).
GPU_LABEL = "example.com/gpu"


def test_helm_upgrade_reloads_or_rolls_and_ca_keeps_its_provider(
    real_node: RealNode,
    release: Release,
    published: Published,
    ca_client: ClientFiles,
    autoscaler: Autoscaler,
    tmp_path: Path,
) -> None:
    """helm 4's `helm upgrade --wait` of the chart from the registry, four times. The group's
    maxSize changed (reloadConfig, the default): the running Pods reload the changed
    ConfigMap, no Pod is replaced, and the Service answers the new maxSize once the kubelet
    brought the file in. gpuLabel changed, which only a restart applies: the checksum of such
    settings rolls both Pods, and the new ones answer the new label. With reloadConfig false
    any config change rolls them. `helm rollback --wait` to the gpuLabel revision rolls them
    back to it. Each time calls through the Service go unanswered no longer than the
    documented bound, and CA shows the last maxSize."""
    wait_for(lambda: all_ready(real_node.kube, SYSTEM, FULLNAME, RELEASE_PODS), 60,
             "both replicas Ready before the upgrade")  # fmt: skip
    step = Step(real_node, release, published, ca_client, autoscaler, tmp_path)
    reloaded = step.upgrade(MAX_SIZE + 1, {})
    assert reloaded.old == reloaded.new, "a reloadable change replaced the Pods"
    restarted = step.upgrade(MAX_SIZE + 1, {"config": {"gpuLabel": GPU_LABEL}}, GPU_LABEL)
    assert not restarted.old & restarted.new, "a setting only a restart applies did not roll"
    revision = step.revision()
    rolled = step.upgrade(MAX_SIZE + 2, {"reloadConfig": False})
    assert not rolled.old & rolled.new, "not rolled"
    back = step.run(MAX_SIZE + 1, GPU_LABEL, "rollback", RELEASE, str(revision))
    assert not back.old & back.new, "the rollback did not roll the Pods"
    results = {"reloaded": reloaded, "restart setting": restarted, "rolled": rolled,
               "rolled back": back}  # fmt: skip
    for name, result in results.items():
        real_node.timings[f"helm upgrade -> {name}"] = result.seconds
        real_node.timings[f"helm upgrade ({name}): longest unanswered"] = result.gap
    wait_for(lambda: ca_status_max_size(real_node, "workers") == MAX_SIZE + 1, 30,
             f"CA's status showing maxSize {MAX_SIZE + 1}")  # fmt: skip


@dataclass
class Upgraded:
    old: set[str]  # the provider's Pods before
    new: set[str]  # and after
    seconds: float  # until the Service answered the new maxSize
    gap: float  # the longest time calls through the Service went unanswered


@dataclass
class Step:
    """helm 4 upgrades and rollbacks of the module's release, each until it is served."""

    node: RealNode
    release: Release
    published: Published
    ca_client: ClientFiles
    autoscaler: Autoscaler
    tmp_path: Path

    def upgrade(self, max_size: int, more: dict[str, Any], gpu: str | None = None) -> Upgraded:
        """`helm upgrade --wait` of the release's values with workers at `max_size` (and
        `more`)."""
        values = deep_merge(self.release.values,
                            {"config": {"nodeGroups": [group(maxSize=max_size)]}})  # fmt: skip
        path = self.tmp_path / f"values-{max_size}-{len(list(self.tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(deep_merge(values, more)))
        chart = self.published.chart
        return self.run(max_size, gpu, "upgrade", RELEASE, chart.reference, *chart.options,
                        "-f", str(path))  # fmt: skip

    def revision(self) -> int:
        done = helm(self.node.kube, "status", RELEASE, "--namespace", SYSTEM, "-o", "json")
        assert done.returncode == 0, done.stderr
        return int(json.loads(done.stdout)["version"])

    def run(self, max_size: int, gpu: str | None, *args: str) -> Upgraded:
        """`helm ARGS --wait`, until the Service answers `max_size` (and the GPU label
        `gpu`, when given) and both replicas are Ready."""
        node = self.node
        old = {p.metadata.name for p in provider_pods(node)}
        log_before = len(self.autoscaler.output)
        with self.release.probe(self.ca_client) as probe:
            started = time.monotonic()
            done = helm(node.kube, *args, "--namespace", SYSTEM, "--wait",
                        "--timeout", f"{INSTALL_LIMIT_SECONDS}s")  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr

            def served() -> bool:
                return (
                    all_ready(node.kube, SYSTEM, FULLNAME, RELEASE_PODS)
                    and (probe.last_answer() or {}).get("workers") == max_size
                    and (gpu is None or probe.gpu_label() == gpu)
                )

            wait_for(served, 120, f"the Service never answered maxSize {max_size} ({gpu})")
            seconds = time.monotonic() - started
        gap = probe.longest_gap()
        ca_errors = self.autoscaler.output[log_before:].count("rpc error")
        print(f"helm {args[0]} to maxSize {max_size} ({gpu}): served after {seconds:.1f}s, "
              f"longest unanswered {gap:.1f}s ({probe.summary()}; {ca_errors} rpc error lines "
              "in CA's log)")  # fmt: skip
        assert gap < HANDOVER_LIMIT_SECONDS, probe.summary()
        return Upgraded(old, {p.metadata.name for p in provider_pods(node)}, seconds, gap)


def evict(node: RealNode, name: str) -> None:
    """The Eviction API (policy/v1), as `kubectl drain` uses it."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": SYSTEM}}  # fmt: skip
    node.core().create_namespaced_pod_eviction(name, SYSTEM, body)


def budget_settled(node: RealNode) -> bool:
    """The PodDisruptionBudget counts both replicas healthy and allows one disruption."""
    pdb = k8s.PolicyV1Api(node.kube.client()).read_namespaced_pod_disruption_budget(
        FULLNAME, SYSTEM
    )
    status = pdb.status
    return bool(
        status.observed_generation == pdb.metadata.generation
        and status.current_healthy == 2
        and status.disruptions_allowed == 1
    )


def test_the_budget_refuses_evicting_both_replicas(
    real_node: RealNode, release: Release, ca_client: ClientFiles
) -> None:
    """Evicting the leader is allowed; evicting the other replica right after is refused by
    the PodDisruptionBudget (429). The Service keeps a provider: the Lease and the endpoint
    move to a replica that was not evicted."""
    wait_for(lambda: budget_settled(real_node), 60, "the PDB allowing one disruption of two")
    leader = lease_holder(real_node.kube, SYSTEM, FULLNAME)
    [standby] = [p.metadata.name for p in provider_pods(real_node) if p.metadata.name != leader]
    with release.probe(ca_client) as probe:
        evict(real_node, leader)
        with pytest.raises(k8s.ApiException) as refused:
            evict(real_node, standby)

        wait_for(lambda: routed_past(real_node, leader), 30,
                 "the Lease and the Service moved off the evicted leader")  # fmt: skip
        time.sleep(1)  # a few calls to the new leader
    assert refused.value.status == 429, refused.value
    assert "disruption budget" in str(refused.value.body), refused.value.body
    gap = probe.longest_gap()
    real_node.timings["eviction: longest unanswered"] = gap
    print(f"evictions: longest unanswered {gap:.1f}s ({probe.summary()})")
    assert gap < HANDOVER_LIMIT_SECONDS, probe.summary()
    wait_for(lambda: all_ready(real_node.kube, SYSTEM, FULLNAME, RELEASE_PODS), 60,
             "both replicas Ready again")  # fmt: skip


def kustomize_overlay(directory: Path, published: Published, cloud_url: str) -> Path:
    """What a user's overlay of the base changes here: the image (the registry's, by digest),
    the config's cluster and cloud API (the emulator), ScheduleAnyway as for the chart (the
    tainted Nodes of emulated servers count as places for a replica), and no cert-manager
    objects (no cert-manager here: its Secrets are created as it would)."""
    config = yaml.safe_load((KUSTOMIZE_BASE / "config.yaml").read_text())
    config["cluster"] = "kustomized"
    config["cloudscale"]["url"] = cloud_url
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    deployment_patch = [
        {"op": "replace", "path": "/spec/template/spec/topologySpreadConstraints/0/"
         "whenUnsatisfiable", "value": "ScheduleAnyway"},
    ]  # fmt: skip
    no_cert_manager = {"$patch": "delete", "apiVersion": "cert-manager.io/v1", "kind": "Any",
                       "metadata": {"name": "any"}}  # fmt: skip
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes no absolute path here.
        "resources": [os.path.relpath(KUSTOMIZE_BASE, directory)],
        "images": [{"name": "ghcr.io/cloudscale-autoscaler/cloudscale-autoscaler",
                    "newName": published.repository, "digest": published.digest}],
        "configMapGenerator": [{"name": "cloudscale-autoscaler-config", "behavior": "replace",
                                "files": ["config.yaml"]}],
        "patches": [
            {"target": {"kind": "Deployment", "name": "cloudscale-autoscaler"},
             "patch": json.dumps(deployment_patch)},
            {"target": {"group": "cert-manager.io"}, "patch": yaml.safe_dump(no_cert_manager)},
        ],
    }  # fmt: skip
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


# The base's Pods (the chart's carry app.kubernetes.io/instance too).
BASE_PODS = "app.kubernetes.io/name=cloudscale-autoscaler,!app.kubernetes.io/instance"


def test_the_kustomize_base_rolls_out_two_ready_replicas(
    real_node: RealNode,
    published: Published,
    gateway_emulator: GatewayEmulator,
    provider_ca: Issued,
    tmp_path: Path,
) -> None:
    """The base through an overlay, applied server-side as `kubectl apply -k` would, with the
    token and certificate Secrets first: both replicas Ready by the kubelet's probes, the
    rollout complete, the gRPC Service's EndpointSlice listing the leader alone."""
    overlay = kustomize_overlay(tmp_path, published, gateway_emulator.url)
    built = subprocess.run([ensure(KUSTOMIZE), "build", str(overlay)], capture_output=True,
                           text=True, timeout=120, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    documents = rendered(built.stdout)
    assert not certificates(documents), "the overlay kept cert-manager objects"
    core = real_node.core()
    # The chart's install above uses the same name: the user's one Secret.
    create_unless_exists(core, SYSTEM, token_secret("cloudscale-autoscaler-token"))
    base_certificates = rendered((KUSTOMIZE_BASE / "certificates.yaml").read_text())
    create_secrets(real_node.kube, SYSTEM, base_certificates, provider_ca)
    apply(real_node.kube, documents, "kustomize-test")
    name = "cloudscale-autoscaler"
    try:
        rolled = wait_for(lambda: all_ready(real_node.kube, SYSTEM, name, BASE_PODS), 120,
                          "the base's replicas Ready")  # fmt: skip
    except AssertionError as late:
        states = [
            (p.metadata.name, p.status.phase, p.status.conditions, p.status.container_statuses)
            for p in live_pods(core, SYSTEM, BASE_PODS)
        ]
        raise AssertionError(f"{late}: {states}") from None
    real_node.timings["kustomize apply -> both Ready"] = rolled
    leader = lease_holder(real_node.kube, SYSTEM, name)
    assert leader in {p.metadata.name for p in live_pods(core, SYSTEM, BASE_PODS)}
    wait_for(lambda: slice_pods(real_node.kube, SYSTEM, name) == [leader], 30,
             "the base's EndpointSlice listing the leader alone")  # fmt: skip
    print(f"kustomize: both Ready {rolled:.1f}s after the apply")
