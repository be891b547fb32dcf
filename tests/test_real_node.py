"""The real node (tests/fixtures/node.py): a kubelet, containerd and kube-proxy on this machine
run what the chart's Pods will need. The Node goes Ready; a Pod's readiness follows the
kubelet's own probe both ways; a ClusterIP Service reaches its Pod through kube-proxy from the
host and from another Pod; a Pod reaches this host but nothing beyond it; the project's image,
imported into containerd, runs as a Job and talks to the API server with in-cluster config.

Every test that needs the real node is here: one node per machine, and pytest-xdist hands a
module to one worker.
"""

from __future__ import annotations

import http.server
import ipaddress
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fixtures.cluster import condition_true
from fixtures.node import NEEDS_NODE, RealNode
from kubernetes import client as k8s
from kubernetes.stream import stream

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
    log = core.read_namespaced_pod_log("web-client", namespace)
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
    log = core.read_namespaced_pod_log("egress", namespace)
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
    help_log = core.read_namespaced_pod_log(help_pod.metadata.name, namespace)
    assert "usage: cloudscale-autoscaler" in help_log
    assert "serve" in help_log

    pod = wait_pod(core, "whoami", finished, "finished")
    log = core.read_namespaced_pod_log("whoami", namespace)
    assert pod.status.phase == "Succeeded", log
    assert log.strip() == f"user: system:serviceaccount:{namespace}:default"


def _wait_job_complete(batch: k8s.BatchV1Api, name: str) -> None:
    deadline = time.monotonic() + POD_LIMIT_SECONDS
    while not condition_true(batch.read_namespaced_job(name, NAMESPACE).status, "Complete"):
        job = batch.read_namespaced_job(name, NAMESPACE)
        assert not condition_true(job.status, "Failed"), job.status
        assert time.monotonic() < deadline, f"Job {name} not complete: {job.status}"
        time.sleep(0.2)
