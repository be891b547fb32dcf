"""Offline validation of deploy/ (kustomize, Helm chart, Cluster Autoscaler examples) and the
Dockerfile.

Every Kubernetes manifest is deserialized into the `kubernetes` package's models and serialized
back; a field the model does not know (a typo such as `readOnlyRootFileSystem`) does not survive
the round trip and is reported. cert-manager, Prometheus Operator and kustomize documents have
no models there and are checked against the small schemas below.

The built outputs (`kustomize build`, `helm template`) are then checked for what makes the
deployment work: the config validates with the real loader and points at the mounted files, the
server certificate names the host Cluster Autoscaler dials, the hardening is in place.

helm and kustomize come from PATH (kustomize also as `kubectl kustomize`), else from the cache
fixtures/tools.py builds them into once. Tests that need one skip, with the reason, only when
that build fails (CI builds them before the tests).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.tools import INSTALL_TIMEOUT_SECONDS
from kubernetes.client import ApiClient, models

from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.reload.fixed import RELOADABLE
from cloudscale_autoscaler.settings.types import Config
from cloudscale_autoscaler.transport.certs import mint_dev_pki

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUSTOMIZE_DIR = DEPLOY / "kustomize"
BASE = KUSTOMIZE_DIR / "base"
OVERLAY = KUSTOMIZE_DIR / "overlays" / "example"
CHART = DEPLOY / "helm" / "cloudscale-autoscaler"
# The alert rules: the plain file links to the one the chart embeds.
CHART_RULES = CHART / "files" / "alerts.yaml"
PLAIN_RULES = DEPLOY / "prometheus" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
EXAMPLES = DEPLOY / "examples"

PROVIDER = "cloudscale-autoscaler"  # container name, and object names in kube-system
CLIENT_CN = "cluster-autoscaler"
CLUSTER_SCOPED = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)
# Node Events live in `default`: the one Role (and binding) outside the provider's namespace.
NODE_EVENTS = "node-events"
CLOUD_CONFIG_KEYS = {"address", "cert", "key", "cacert", "grpc_timeout"}
# Which file of a cert-manager Secret each TLS setting of the config must name.
TLS_FILES = {"cert": "tls.crt", "key": "tls.key", "clientCA": "ca.crt"}

KUBE_VERSION = "1.34.0"  # what `helm template` and `helm lint` render for
# A test that may have to build helm or kustomize first gets time for that.
NEEDS_TOOL = pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)

Doc = dict[str, Any]


# --- YAML files under deploy/ --------------------------------------------------------------


def load_docs(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def read_docs(path: Path) -> list[Doc]:
    return load_docs(path.read_text(encoding="utf-8"))


def yaml_files() -> list[Path]:
    """Every YAML file under deploy/ except Helm templates (Go templates, not YAML)."""
    files = [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
    return sorted(p for p in files if CHART / "templates" not in p.parents)


def kustomizations() -> list[Path]:
    return sorted(KUSTOMIZE_DIR.rglob("kustomization.yaml"))


def _kustomization_refs(path: Path, field: str) -> list[Path]:
    """Files a kustomization names in configMapGenerator[].files or patches[].path."""
    (doc,) = read_docs(path)
    if field == "generated":
        names = [f for gen in doc.get("configMapGenerator", []) for f in gen.get("files", [])]
    else:
        names = [patch["path"] for patch in doc.get("patches", []) if "path" in patch]
    return [(path.parent / name.split("=")[-1]).resolve() for name in names]


def role_of(path: Path) -> str:
    """What a YAML file under deploy/ is, and so how it is checked."""
    if path.name == "kustomization.yaml":
        return "kustomization"
    if any(path in _kustomization_refs(k, "generated") for k in kustomizations()):
        return "provider-config"
    if any(path in _kustomization_refs(k, "patches") for k in kustomizations()):
        return "patch"
    if path.parent == CHART:
        return {"Chart.yaml": "chart", "values.yaml": "chart-values"}.get(path.name, "unknown")
    if path.name.endswith("-values.yaml"):
        return "ca-chart-values"
    if path in (PLAIN_RULES, CHART_RULES):
        return "prometheus-rules"
    return "manifests"


# --- deserializing into Kubernetes models ------------------------------------------------

BUILTIN_GROUPS = frozenset(
    {
        "",
        "apps",
        "batch",
        "policy",
        "autoscaling",
        "networking.k8s.io",
        "rbac.authorization.k8s.io",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "admissionregistration.k8s.io",
        "scheduling.k8s.io",
        "storage.k8s.io",
    }
)


@functools.cache
def api_client() -> ApiClient:
    return ApiClient()


def model_name(api_version: str, kind: str) -> str | None:
    """`apps/v1` + `Deployment` -> `V1Deployment`; None for groups without models here."""
    group, _, version = api_version.rpartition("/")
    if group not in BUILTIN_GROUPS:
        return None
    name = version[:1].upper() + version[1:] + kind
    return name if hasattr(models, name) else None


def lost_fields(original: Any, echoed: Any, path: str = "") -> list[str]:
    """Where `echoed` (after the model round trip) differs from `original`."""
    if isinstance(original, dict):
        if not isinstance(echoed, dict):
            return [f"{path}: expected a mapping"]
        problems = []
        for key, value in original.items():
            here = f"{path}.{key}" if path else str(key)
            if key not in echoed:
                problems.append(f"{here}: not a field of this object")
            else:
                problems += lost_fields(value, echoed[key], here)
        return problems
    if isinstance(original, list):
        if not isinstance(echoed, list) or len(echoed) != len(original):
            return [f"{path}: list changed in the round trip"]
        pairs = zip(original, echoed, strict=True)
        return [p for i, (a, b) in enumerate(pairs) for p in lost_fields(a, b, f"{path}[{i}]")]
    if type(original) is not type(echoed) or original != echoed:
        return [f"{path}: {original!r} did not survive the round trip (got {echoed!r})"]
    return []


def deserialize(doc: Doc) -> list[str]:
    """Problems with one built-in object, or with a custom resource via its schema."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return ["apiVersion and kind are required strings"]
    custom = CUSTOM_SCHEMAS.get((api_version, kind))
    if custom is not None:
        return check_custom(doc, custom)
    name = model_name(api_version, kind)
    if name is None:
        return [f"{api_version} {kind}: no Kubernetes model and no schema for it here"]
    # The private deserializer is the one `ApiClient.deserialize` uses on HTTP responses.
    client: Any = api_client()
    try:
        obj = client._ApiClient__deserialize(doc, name)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        return [f"{kind}: {exc}"]
    return lost_fields(doc, client.sanitize_for_serialization(obj))


def assert_deserializes(docs: list[Doc], source: str) -> None:
    problems = [
        f"{source}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}: {problem}"
        for doc in docs
        for problem in deserialize(doc)
    ]
    assert not problems, "\n".join(problems)


# --- small schemas for the custom resources and kustomize files -------------------------
#
# A shape is a type (str, int, bool, dict, list), a frozenset of allowed values, a compiled
# regex a string must match, a one-item list [shape] (a list of those), or an `Obj` (a mapping
# with exactly these keys).


@dataclass(frozen=True)
class Obj:
    required: dict[str, Any]
    optional: dict[str, Any]


GO_DURATION = re.compile(r"([0-9]+(\.[0-9]+)?(h|m|s|ms))+")
DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
CERT_USAGES = frozenset(
    {
        "signing",
        "digital signature",
        "content commitment",
        "key encipherment",
        "key agreement",
        "data encipherment",
        "cert sign",
        "crl sign",
        "server auth",
        "client auth",
    }
)
METADATA = Obj({"name": str}, {"namespace": str, "labels": dict, "annotations": dict})
ISSUER_REF = Obj({"name": str}, {"kind": frozenset({"Issuer", "ClusterIssuer"}), "group": str})
PRIVATE_KEY = Obj(
    {},
    {
        "algorithm": frozenset({"RSA", "ECDSA", "Ed25519"}),
        "size": int,
        "encoding": frozenset({"PKCS1", "PKCS8"}),
        "rotationPolicy": frozenset({"Never", "Always"}),
    },
)
CERTIFICATE_SPEC = Obj(
    {"secretName": str, "issuerRef": ISSUER_REF},
    {
        "commonName": str,
        "dnsNames": [DNS_NAME],
        "ipAddresses": [str],
        "usages": [CERT_USAGES],
        "isCA": bool,
        "duration": GO_DURATION,
        "renewBefore": GO_DURATION,
        "privateKey": PRIVATE_KEY,
        "subject": dict,
        "secretTemplate": dict,
    },
)
ISSUER_SPEC = Obj(
    {},
    {
        "selfSigned": Obj({}, {"crlDistributionPoints": [str]}),
        "ca": Obj({"secretName": str}, {"crlDistributionPoints": [str], "ocspServers": [str]}),
        "acme": dict,
        "vault": dict,
        "venafi": dict,
    },
)
SERVICE_MONITOR_SPEC = Obj(
    {
        "selector": Obj({}, {"matchLabels": dict, "matchExpressions": list}),
        "endpoints": [
            Obj(
                {"port": str},
                {
                    "path": str,
                    "scheme": frozenset({"http", "https"}),
                    "interval": GO_DURATION,
                    "scrapeTimeout": GO_DURATION,
                    "honorLabels": bool,
                    "relabelings": list,
                    "metricRelabelings": list,
                },
            )
        ],
    },
    {"namespaceSelector": dict, "jobLabel": str, "targetLabels": [str]},
)
# A Prometheus rules file, which is also a PrometheusRule's spec.
RULE_GROUPS = Obj(
    {
        "groups": [
            Obj(
                {
                    "name": str,
                    "rules": [
                        Obj(
                            {"expr": str},
                            {
                                "alert": str,
                                "record": str,
                                "for": GO_DURATION,
                                "keep_firing_for": GO_DURATION,
                                "labels": dict,
                                "annotations": dict,
                            },
                        )
                    ],
                },
                {"interval": GO_DURATION, "limit": int},
            )
        ]
    },
    {},
)


def _custom(api_version: str, kind: str, spec: Obj) -> Obj:
    return Obj(
        {
            "apiVersion": frozenset({api_version}),
            "kind": frozenset({kind}),
            "metadata": METADATA,
            "spec": spec,
        },
        {},
    )


CUSTOM_SCHEMAS: dict[tuple[str, str], Obj] = {
    ("cert-manager.io/v1", "Certificate"): _custom(
        "cert-manager.io/v1", "Certificate", CERTIFICATE_SPEC
    ),
    ("cert-manager.io/v1", "Issuer"): _custom("cert-manager.io/v1", "Issuer", ISSUER_SPEC),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _custom(
        "monitoring.coreos.com/v1", "ServiceMonitor", SERVICE_MONITOR_SPEC
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _custom(
        "monitoring.coreos.com/v1", "PrometheusRule", RULE_GROUPS
    ),
}


def check_custom(doc: Doc, schema: Obj) -> list[str]:
    problems = check_shape(doc, schema, "")
    spec = doc.get("spec")
    if doc["kind"] == "Issuer" and isinstance(spec, dict) and len(spec) != 1:
        problems.append(f"spec: an Issuer has exactly one type, got {sorted(spec)}")
    return problems


KUSTOMIZE_COMMON: dict[str, Any] = {
    "namespace": str,
    "resources": [str],
    "components": [str],
    "configMapGenerator": [
        Obj({"name": str}, {"files": [str], "literals": [str], "behavior": str, "options": dict})
    ],
    "images": [Obj({"name": str}, {"newName": str, "newTag": str, "digest": str})],
    "patches": [Obj({}, {"path": str, "patch": str, "target": dict, "options": dict})],
    "labels": [Obj({"pairs": dict}, {"includeSelectors": bool, "includeTemplates": bool})],
    "commonAnnotations": dict,
    "replacements": list,
    # Inline transformer configs (YAML text), as the base's namespace transformer.
    "transformers": [str],
}
KUSTOMIZATION = Obj(
    {
        "apiVersion": frozenset({"kustomize.config.k8s.io/v1beta1"}),
        "kind": frozenset({"Kustomization"}),
    },
    KUSTOMIZE_COMMON,
)
COMPONENT = Obj(
    {
        "apiVersion": frozenset({"kustomize.config.k8s.io/v1alpha1"}),
        "kind": frozenset({"Component"}),
    },
    KUSTOMIZE_COMMON,
)


def check_shape(value: Any, shape: Any, path: str) -> list[str]:
    where = path or "<document>"
    if isinstance(shape, Obj):
        return _check_obj(value, shape, path)
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [
            p for i, item in enumerate(value) for p in check_shape(item, shape[0], f"{path}[{i}]")
        ]
    if isinstance(shape, frozenset):
        return [] if value in shape else [f"{where}: {value!r} is not one of {sorted(shape)}"]
    if isinstance(shape, re.Pattern):
        ok = isinstance(value, str) and shape.fullmatch(value)
        return [] if ok else [f"{where}: {value!r} does not match {shape.pattern}"]
    if isinstance(value, bool) and shape is not bool:
        return [f"{where}: expected {shape.__name__}, got a boolean"]
    return [] if isinstance(value, shape) else [f"{where}: expected {shape.__name__}"]


def _check_obj(value: Any, shape: Obj, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path or '<document>'}: expected a mapping"]

    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    known = {**shape.required, **shape.optional}
    problems = [f"{at(key)}: unknown field" for key in value if key not in known]
    problems += [f"{at(key)}: required" for key in shape.required if key not in value]
    for key, sub in known.items():
        if key in value:
            problems += check_shape(value[key], sub, at(key))
    return problems


# --- tools: helm and kustomize ------------------------------------------------------------


def run(cmd: list[str], *, timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


def kustomize_build(kustomize: list[str], directory: Path) -> list[Doc]:
    done = run([*kustomize, str(directory)])
    assert done.returncode == 0, f"kustomize build {directory} failed:\n{done.stderr}"
    return load_docs(done.stdout)


def helm_template(
    helm: str, *args: str, release: str = PROVIDER, namespace: str = "kube-system"
) -> subprocess.CompletedProcess[str]:
    cmd = [helm, "template", release, str(CHART), "--namespace", namespace]
    return run([*cmd, "--kube-version", KUBE_VERSION, *args])


def helm_render(helm: str, *args: str, **kwargs: str) -> list[Doc]:
    done = helm_template(helm, *args, **kwargs)
    assert done.returncode == 0, f"helm template {shlex.join(args)} failed:\n{done.stderr}"
    return load_docs(done.stdout)


# --- a rendered set of objects and what must hold across them --------------------------


@dataclass
class Bundle:
    docs: list[Doc]

    def all(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> Doc:
        found = [d for d in self.all(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def provider(self) -> Doc:
        found = [d for d in self.all("Deployment") if container_of(d)["name"] == PROVIDER]
        assert len(found) == 1, f"expected one provider Deployment, found {len(found)}"
        return found[0]

    def certificate(self, usage: str) -> Doc:
        found = [d for d in self.all("Certificate") if usage in d["spec"].get("usages", [])]
        assert len(found) == 1, f"expected one Certificate for {usage}, found {len(found)}"
        return found[0]


def container_of(deployment: Doc) -> Doc:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "one container per pod"
    result: Doc = containers[0]
    return result


def volume(deployment: Doc, name: str) -> Doc:
    volumes: list[Doc] = deployment["spec"]["template"]["spec"]["volumes"]
    (found,) = [v for v in volumes if v["name"] == name]
    return found


def mount_path(deployment: Doc, name: str) -> str:
    (found,) = [
        m["mountPath"] for m in container_of(deployment)["volumeMounts"] if m["name"] == name
    ]
    return str(found)


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def go_seconds(duration: str) -> float:
    """Seconds in a Go duration made of h, m and s parts ("2160h", "1h30m")."""
    parts = re.findall(r"([0-9.]+)(h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, f"unsupported duration {duration!r}"
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def check_hardening(deployment: Doc) -> None:
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = container_of(deployment)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][bound]), bound
    # Written: /tmp and, without leader election, the creation journal's stateDir.
    writable = {"tmp", "state"}
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] not in writable)


def check_probes(deployment: Doc, config: Doc) -> None:
    container = container_of(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == port_of(config["metrics"]["listen"])
    assert ports["grpc"] == port_of(config["listen"])
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe


def provider_config(bundle: Bundle) -> Doc:
    """The config file the provider Deployment mounts, parsed."""
    deployment = bundle.provider()
    config_map = bundle.get("ConfigMap", volume(deployment, "config")["configMap"]["name"])
    args = container_of(deployment)["args"]
    # The ConfigMap's directory, mounted whole (no subPath), so a changed config reaches the
    # running provider, which reloads it.
    mount = next(m for m in container_of(deployment)["volumeMounts"] if m["name"] == "config")
    assert "subPath" not in mount
    assert f"--config={mount['mountPath']}/config.yaml" in args
    parsed: Doc = yaml.safe_load(config_map["data"]["config.yaml"])
    return parsed


def check_config_paths(deployment: Doc, config: Doc) -> None:
    """The config's TLS and token paths are the files the pod mounts; without leader
    election the creation journal's stateDir is a volume that outlives the container."""
    tls_dir = mount_path(deployment, "tls")
    for key, file_name in TLS_FILES.items():
        assert config["tls"][key] == f"{tls_dir}/{file_name}", f"tls.{key}"
    token = volume(deployment, "token")["secret"]
    (item,) = token["items"]
    assert config["cloudscale"]["tokenFile"] == f"{mount_path(deployment, 'token')}/{item['path']}"
    if elects(config):
        assert "stateDir" not in config
    else:
        assert config["stateDir"] == mount_path(deployment, "state")
        assert "emptyDir" in volume(deployment, "state")


def load_pod_config(config: Doc, tmp_path: Path) -> Config:
    """Load `config` with the real loader, its in-pod files recreated under tmp_path:
    a development PKI in cert-manager's Secret layout and a token file."""
    local = json.loads(json.dumps(config))
    pki = mint_dev_pki()
    contents = {
        "cert": pki.server.cert_pem(),
        "key": pki.server.key_pem(),
        "clientCA": pki.ca.cert_pem(),
    }
    for key, content in contents.items():
        local["tls"][key] = str(_write_under(tmp_path, config["tls"][key], content))
    token_file = _write_under(tmp_path, config["cloudscale"]["tokenFile"], b"test-token\n")
    local["cloudscale"]["tokenFile"] = str(token_file)
    if "stateDir" in local:
        local["stateDir"] = str(tmp_path / local["stateDir"].lstrip("/"))
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(local), encoding="utf-8")
    return load_config(config_file, env={})


def _write_under(tmp_path: Path, pod_path: str, content: bytes) -> Path:
    local = tmp_path / pod_path.lstrip("/")
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(content)
    local.chmod(0o600)
    return local


def elects(config: Doc) -> bool:
    return bool(((config.get("kubernetes") or {}).get("leaderElection") or {}).get("enabled"))


def check_service(bundle: Bundle, config: Doc) -> Doc:
    """The gRPC Service selects the provider's Pods, or, with leader election, nothing: its
    one EndpointSlice, which only the leader writes, is made empty by the install and named
    in the config. A second Service selects every replica's metrics port. Returns the gRPC
    one."""
    deployment = bundle.provider()
    services = sorted(bundle.all("Service"), key=lambda s: str(s["metadata"]["name"]))
    grpc_service, metrics_service = services
    assert metrics_service["metadata"]["name"] == grpc_service["metadata"]["name"] + "-metrics"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    if elects(config):
        assert "selector" not in grpc_service["spec"]
        check_leader_route(bundle, config, grpc_service)
    else:
        assert grpc_service["spec"]["selector"].items() <= pod_labels.items()
        assert not bundle.all("EndpointSlice")
    assert metrics_service["spec"]["selector"].items() <= pod_labels.items()
    assert metrics_service["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    assert {p["name"] for p in container_of(deployment)["ports"]} == {"grpc", "metrics"}
    assert [p["targetPort"] for p in grpc_service["spec"]["ports"]] == ["grpc"]
    assert [p["targetPort"] for p in metrics_service["spec"]["ports"]] == ["metrics"]
    for monitor in bundle.all("ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        assert wanted <= metrics_service["metadata"]["labels"].items()
        assert not wanted <= grpc_service["metadata"]["labels"].items()
    return grpc_service


def check_leader_route(bundle: Bundle, config: Doc, service: Doc) -> None:
    """The EndpointSlice the config names belongs to the gRPC Service (kube-proxy's label), is
    not the EndpointSlice controller's, carries the grpc port the container listens on and no
    endpoints (an upgrade leaves the leader's alone); the journal's ConfigMap exists, empty;
    the admission policy that pins the slice's labels and ports binds to the account."""
    election = config["kubernetes"]["leaderElection"]
    (route,) = bundle.all("EndpointSlice")
    assert route["metadata"]["name"] == election["endpointSlice"]
    labels = route["metadata"]["labels"]
    assert labels["kubernetes.io/service-name"] == service["metadata"]["name"]
    assert labels["endpointslice.kubernetes.io/managed-by"] != "endpointslice-controller.k8s.io"
    container_port = next(
        p["containerPort"] for p in container_of(bundle.provider())["ports"] if p["name"] == "grpc"
    )
    assert route["ports"] == [{"name": "grpc", "port": container_port, "protocol": "TCP"}]
    assert "endpoints" not in route
    journal = bundle.get("ConfigMap", election["journalConfigMap"])
    assert "data" not in journal
    # The install creates the Lease (the account may not), without a holder to fight over.
    lease = bundle.get("Lease", election["leaseName"])
    assert "spec" not in lease
    (policy,) = bundle.all("ValidatingAdmissionPolicy")
    (binding,) = bundle.all("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": ["discovery.k8s.io"], "apiVersions": ["*"],
                      "operations": ["UPDATE"], "resources": ["endpointslices"]}]  # fmt: skip


def cloud_config(bundle: Bundle) -> Doc:
    found = [d for d in bundle.all("ConfigMap") if "cloud-config" in d.get("data", {})]
    assert len(found) == 1, f"expected one cloud-config ConfigMap, found {len(found)}"
    parsed: Doc = yaml.safe_load(found[0]["data"]["cloud-config"])
    assert set(parsed) == CLOUD_CONFIG_KEYS
    return parsed


def check_cloud_config(bundle: Bundle, service: Doc) -> str:
    """The address CA dials reaches the Service's gRPC port; returns its host."""
    parsed = cloud_config(bundle)
    host, _, port = parsed["address"].rpartition(":")
    meta = service["metadata"]
    assert host == f"{meta['name']}.{meta['namespace']}.svc"
    grpc = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert int(port) == grpc[0]["port"]
    cert_dir = parsed["cert"].rpartition("/")[0]
    assert parsed["cert"] == f"{cert_dir}/tls.crt"
    assert parsed["key"] == f"{cert_dir}/tls.key"
    assert parsed["cacert"] == f"{cert_dir}/ca.crt"
    assert go_seconds(parsed["grpc_timeout"]) > 5, "longer than CA's 5 s default"
    return str(host)


def check_certificates(bundle: Bundle, service: Doc, dialed_host: str, config: Doc) -> None:
    server, client = bundle.certificate("server auth"), bundle.certificate("client auth")
    assert server["spec"]["secretName"] == volume(bundle.provider(), "tls")["secret"]["secretName"]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    fqdn = f"{name}.{namespace}.svc"
    expected = {name, f"{name}.{namespace}", fqdn, f"{fqdn}.cluster.local"}
    assert expected <= set(server["spec"]["dnsNames"])
    assert dialed_host in server["spec"]["dnsNames"], "CA checks its ServerName against the SANs"
    allowed = config["tls"].get("allowedClients") or [client["spec"]["commonName"]]
    assert client["spec"]["commonName"] == CLIENT_CN and CLIENT_CN in allowed
    for cert in bundle.all("Certificate"):
        spec = cert["spec"]
        assert go_seconds(spec["duration"]) > go_seconds(spec["renewBefore"]), cert["metadata"]
    check_issuer_chain(bundle, server, client)


def check_issuer_chain(bundle: Bundle, *leaves: Doc) -> None:
    """Leaves <- CA Issuer <- its isCA Certificate <- a self-signed Issuer."""
    (ca_issuer,) = {leaf["spec"]["issuerRef"]["name"] for leaf in leaves}
    ca_secret = bundle.get("Issuer", ca_issuer)["spec"]["ca"]["secretName"]
    (ca_cert,) = [c for c in bundle.all("Certificate") if c["spec"]["secretName"] == ca_secret]
    assert ca_cert["spec"]["isCA"] is True
    root = bundle.get("Issuer", ca_cert["spec"]["issuerRef"]["name"])
    assert "selfSigned" in root["spec"]


def rules_of(bundle: Bundle, kind: str, subject: Doc, namespace: str | None = None) -> list[Doc]:
    """Rules of every `kind` (Role, ClusterRole) bound to `subject` by its binding kind, in
    `namespace` (Roles), in the order of the roles' names (kustomize sorts them, Helm keeps
    the templates' order)."""
    binding_kind = f"{kind}Binding"
    bindings = [
        b
        for b in bundle.all(binding_kind)
        if b["roleRef"]["kind"] == kind
        and subject in b["subjects"]
        and b["metadata"].get("namespace") == namespace
    ]
    roles = [
        r
        for b in bindings
        for r in bundle.all(kind)
        if r["metadata"]["name"] == b["roleRef"]["name"]
        and r["metadata"].get("namespace") == namespace
    ]
    roles.sort(key=lambda role: str(role["metadata"]["name"]))
    return [rule for role in roles for rule in role["rules"]]


# Create only: `patch` cannot be limited to names and would reach every Event.
EVENT_RULES = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def check_cluster_access(bundle: Bundle, config: Doc) -> None:
    """With the `kubernetes` section: a token and RBAC for exactly what the provider does
    (docs/deployment.md, Rights): read Nodes; create Events in its namespace and in `default`;
    with leader election, by name: get and update its own Lease (no Lease create), patch
    its EndpointSlice and get and patch its journal ConfigMap; no right on Pods or Secrets.
    With several replicas: leader election, one replica per node, a rolling update one at a
    time, a PDB unless turned off, and the downward API's Pod name, namespace, uid and IP.
    Without the section: none of that, and Recreate."""
    deployment = bundle.provider()
    pod = deployment["spec"]["template"]["spec"]
    namespace = deployment["metadata"]["namespace"]
    subject = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": namespace}
    kube = config.get("kubernetes")
    replicas = deployment["spec"]["replicas"]
    assert pod["automountServiceAccountToken"] is (kube is not None)
    if kube is None:
        assert replicas == 1, "several replicas without leader election would race"
        assert not bundle.all("ClusterRole") and not bundle.all("Role")
        assert not bundle.all("PodDisruptionBudget")
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        return
    assert rules_of(bundle, "ClusterRole", subject) == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    ]
    assert rules_of(bundle, "Role", subject, "default") == EVENT_RULES
    election = kube["leaderElection"]
    assert election["enabled"] is True and replicas == 2
    assert election.get("namespace", namespace) == namespace
    assert rules_of(bundle, "Role", subject, namespace) == [
        *EVENT_RULES,
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [election["journalConfigMap"]],
            "verbs": ["get", "patch"],
        },
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [election["leaseName"]],
            "verbs": ["get", "update"],
        },
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "resourceNames": [election["endpointSlice"]],
            "verbs": ["patch"],
        },
    ]
    strategy = deployment["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}  # fmt: skip
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for pdb in bundle.all("PodDisruptionBudget"):
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container_of(deployment)["env"]
    }
    assert env == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
        "POD_IP": "status.podIP",
    }


def check_namespaces(docs: list[Doc]) -> None:
    """Everything in the provider's namespace, but the cluster-scoped objects (no namespace)
    and the Role for Node Events and its binding (in `default`)."""
    namespaced = [d for d in docs if d["kind"] not in CLUSTER_SCOPED]
    node_events = [d for d in namespaced if d["metadata"]["name"].endswith(NODE_EVENTS)]
    namespaces = {d["metadata"].get("namespace") for d in namespaced if d not in node_events}
    assert len(namespaces) == 1 and None not in namespaces, f"one namespace: {namespaces}"
    assert {d["metadata"].get("namespace") for d in node_events} <= {"default"}
    assert all("namespace" not in d["metadata"] for d in docs if d["kind"] in CLUSTER_SCOPED)


def check_bundle(docs: list[Doc], tmp_path: Path, source: str) -> Bundle:
    """Everything that must hold for a rendered install (kustomize build or helm template)."""
    assert_deserializes(docs, source)
    bundle = Bundle(docs)
    deployment = bundle.provider()
    check_namespaces(docs)
    check_hardening(deployment)
    config = provider_config(bundle)
    check_probes(deployment, config)
    check_config_paths(deployment, config)
    check_cluster_access(bundle, config)
    loaded = load_pod_config(config, tmp_path)
    assert loaded.node_groups, "an example node group"
    service = check_service(bundle, config)
    host = check_cloud_config(bundle, service)
    if bundle.all("Certificate"):
        check_certificates(bundle, service, host, config)
    return bundle


# --- tests: every YAML file --------------------------------------------------------------


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(DEPLOY)) for p in paths]


@pytest.mark.parametrize("path", yaml_files(), ids=_ids(yaml_files()))
def test_yaml_file_parses_and_has_a_known_role(path: Path) -> None:
    docs = read_docs(path)
    assert docs, "no documents"
    assert role_of(path) != "unknown", "every YAML file under deploy/ is checked for its role"


MANIFEST_FILES = [p for p in yaml_files() if role_of(p) == "manifests"]


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=_ids(MANIFEST_FILES))
def test_manifest_deserializes_into_kubernetes_objects(path: Path) -> None:
    assert_deserializes(read_docs(path), str(path.relative_to(DEPLOY)))


@pytest.mark.parametrize("path", kustomizations(), ids=_ids(kustomizations()))
def test_kustomization_schema_and_references_exist(path: Path) -> None:
    (doc,) = read_docs(path)
    schema = COMPONENT if doc.get("kind") == "Component" else KUSTOMIZATION
    assert check_shape(doc, schema, "") == []
    missing = [
        ref
        for ref in [*doc.get("resources", []), *doc.get("components", [])]
        if not (path.parent / ref).exists()
    ]
    missing += [
        str(ref)
        for ref in [*_kustomization_refs(path, "generated"), *_kustomization_refs(path, "patches")]
        if not ref.is_file()
    ]
    assert missing == []


def test_patches_name_an_object_of_the_base() -> None:
    base_objects = {
        (d["kind"], d["metadata"]["name"])
        for k in kustomizations()
        for ref in read_docs(k)[0].get("resources", [])
        if (k.parent / ref).is_file()
        for d in read_docs(k.parent / ref)
    }
    patches = [p for p in yaml_files() if role_of(p) == "patch"]
    assert patches
    for patch in patches:
        for doc in read_docs(patch):
            assert (doc["kind"], doc["metadata"]["name"]) in base_objects, patch


RULE_FILES = [p for p in yaml_files() if role_of(p) == "prometheus-rules"]


@pytest.mark.parametrize("path", RULE_FILES, ids=_ids(RULE_FILES))
def test_prometheus_rules_file_has_the_rules_file_shape(path: Path) -> None:
    (doc,) = read_docs(path)
    assert check_shape(doc, RULE_GROUPS, "") == []


def test_plain_rules_file_is_the_one_the_chart_embeds() -> None:
    """A link, so the two never disagree (tests/test_observability.py tests the rules)."""
    assert PLAIN_RULES.is_symlink()
    assert PLAIN_RULES.resolve() == CHART_RULES.resolve()
    assert RULE_FILES == [CHART_RULES, PLAIN_RULES]


PROVIDER_CONFIGS = [p for p in yaml_files() if role_of(p) == "provider-config"]


@pytest.mark.parametrize("path", PROVIDER_CONFIGS, ids=_ids(PROVIDER_CONFIGS))
def test_kustomize_config_loads_and_matches_the_base_deployment(path: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    (deployment,) = read_docs(BASE / "deployment.yaml")
    check_config_paths(deployment, config)
    check_probes(deployment, config)
    loaded = load_pod_config(config, tmp_path)
    assert loaded.tls.allowed_clients == (CLIENT_CN,)
    assert loaded.node_groups


def test_deserialize_reports_unknown_and_mistyped_fields() -> None:
    """The round trip catches what a bare deserialize would silently drop."""
    (deployment,) = read_docs(BASE / "deployment.yaml")
    assert deserialize(deployment) == []
    container = container_of(deployment)
    container["securityContext"]["readOnlyRootFileSystem"] = True
    problems = deserialize(deployment)
    assert any("readOnlyRootFileSystem: not a field" in p for p in problems), problems
    del container["securityContext"]["readOnlyRootFileSystem"]
    deployment["spec"]["template"]["metadata"]["annotations"]["x"] = False
    assert any("annotations.x" in p for p in deserialize(deployment)), deserialize(deployment)
    del deployment["spec"]["template"]["metadata"]["annotations"]["x"]
    del container["name"]
    missing = "Invalid value for `name`, must not be `None`"  # the client's models (36)
    assert any(missing in p for p in deserialize(deployment)), deserialize(deployment)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["spec"].pop("issuerRef"), "spec.issuerRef: required"),
        (lambda c: c["spec"].update(usages=["server-auth"]), "is not one of"),
        (lambda c: c["spec"].update(dnsNames=["Bad_Name"]), "does not match"),
        (lambda c: c["spec"].update(duration="90d"), "does not match"),
        (lambda c: c["spec"].update(isCa=True), "spec.isCa: unknown field"),
    ],
)
def test_certificate_schema_rejects(mutate: Callable[[Doc], object], expected: str) -> None:
    server = read_docs(BASE / "certificates.yaml")[0]
    assert deserialize(server) == []
    mutate(server)
    assert any(expected in p for p in deserialize(server)), deserialize(server)


@pytest.mark.parametrize(
    ("duration", "seconds"), [("15s", 15), ("720h", 2_592_000), ("1h30m", 5400), ("0.5m", 30)]
)
def test_go_seconds(duration: str, seconds: float) -> None:
    assert go_seconds(duration) == seconds


# Where a release publishes the image, tagged with its version.
PUBLISHED_IMAGE = "ghcr.io/cloudscale-autoscaler/cloudscale-autoscaler"


def test_versions_match_the_project() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == project["version"]
    (base,) = read_docs(BASE / "kustomization.yaml")
    assert [i["newTag"] for i in base["images"]] == [project["version"]]


# --- tests: kustomize builds -------------------------------------------------------------


@NEEDS_TOOL
def test_kustomize_base_builds_a_working_install(kustomize: list[str], tmp_path: Path) -> None:
    bundle = check_bundle(kustomize_build(kustomize, BASE), tmp_path, "kustomize base")
    assert bundle.all("ServiceMonitor") == [], "the base works without Prometheus Operator CRDs"
    assert len(bundle.all("PodDisruptionBudget")) == 1, "both replicas are Ready: on by default"
    assert bundle.all("Secret") == [], "the token Secret is created by hand, never shipped"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    published = f"{PUBLISHED_IMAGE}:{project['version']}"
    assert container_of(bundle.provider())["image"] == published, "the release's image by default"
    namespaced = [
        d
        for d in bundle.docs
        if d["kind"] not in CLUSTER_SCOPED and not d["metadata"]["name"].endswith(NODE_EVENTS)
    ]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"kube-system"}


@NEEDS_TOOL
def test_kustomize_overlay_builds_a_working_install(kustomize: list[str], tmp_path: Path) -> None:
    bundle = check_bundle(kustomize_build(kustomize, OVERLAY), tmp_path, "kustomize overlay")
    (monitor,) = bundle.all("ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    image = container_of(bundle.provider())["image"]
    assert image.startswith("registry.example.com/") and image.endswith(":0.1.0")
    config = provider_config(bundle)
    assert config["cluster"] == "prod", "the overlay's config replaced the base's"
    assert len(bundle.all("PodDisruptionBudget")) == 1, "both replicas are Ready: on by default"


@NEEDS_TOOL
def test_kustomize_pdb_matches_the_charts(kustomize: list[str], helm: str, tmp_path: Path) -> None:
    bundle = check_bundle(kustomize_build(kustomize, OVERLAY), tmp_path, "kustomize overlay")
    (kust,) = bundle.all("PodDisruptionBudget")
    (chart,) = Bundle(helm_render(helm)).all("PodDisruptionBudget")
    assert kust["metadata"]["name"] == chart["metadata"]["name"] == PROVIDER
    assert kust["metadata"]["namespace"] == "kube-system"
    # Selectors differ as the pods' labels do (Helm adds the instance); each selects its own
    # pods (check_bundle).
    assert {**kust["spec"], "selector": None} == {**chart["spec"], "selector": None}


# --- tests: the Helm chart -----------------------------------------------------------------

HELM_CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "defaults": ([], {}),
    "servicemonitor": (["--set", "serviceMonitor.enabled=true"], {}),
    "observability": (
        [
            "--set",
            "prometheusRule.enabled=true,grafanaDashboard.enabled=true",
            "--set",
            "prometheusRule.labels.release=kps,grafanaDashboard.annotations.grafana_folder=CA",
        ],
        {},
    ),
    "no-pdb": (["--set", "podDisruptionBudget.enabled=false"], {}),
    "no-cert-manager": (["--set", "certManager.enabled=false"], {}),
    "single-replica": (["--set", "replicas=1,kubernetes.enabled=false"], {}),
    "no-reload": (["--set", "reloadConfig=false"], {}),
    "other-release": (
        ["--set", "ports.grpc=9443", "--set", "grpcTimeout=30s", "--set", "config.cluster=prod"],
        {"release": "autoscaler", "namespace": "autoscaling"},
    ),
}


@NEEDS_TOOL
@pytest.mark.parametrize(
    "values",
    [
        [],
        ["--set", "serviceMonitor.enabled=true,certManager.enabled=false"],
        ["--set", "prometheusRule.enabled=true,grafanaDashboard.enabled=true"],
    ],
)
def test_helm_lint(helm: str, values: list[str]) -> None:
    done = run([helm, "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, *values])
    assert done.returncode == 0, done.stdout + done.stderr


@NEEDS_TOOL
@pytest.mark.parametrize("case", HELM_CASES)
def test_helm_template_renders_a_working_install(helm: str, case: str, tmp_path: Path) -> None:
    args, names = HELM_CASES[case]
    bundle = check_bundle(helm_render(helm, *args, **names), tmp_path, f"helm {case}")
    assert bool(bundle.all("ServiceMonitor")) == (case == "servicemonitor")
    pdb = case not in ("no-pdb", "single-replica")
    assert len(bundle.all("PodDisruptionBudget")) == pdb, "on by default with two replicas"
    cert_manager = case != "no-cert-manager"
    assert len(bundle.all("Certificate")) == (3 if cert_manager else 0)
    assert len(bundle.all("Issuer")) == (2 if cert_manager else 0)
    assert bundle.all("Secret") == []
    annotations = bundle.provider()["spec"]["template"]["metadata"]["annotations"]
    rolls = case == "no-reload"
    assert ("checksum/config" in annotations) == rolls, "a config change rolls, or is reloaded"
    check_observability(bundle, on=case == "observability")


def restart_checksum(helm: str, *args: str) -> str:
    """The Pod template's checksum of the settings only a restart applies (reloadConfig on)."""
    return _restart_checksum(helm, *args)


def default_groups(**changed: Any) -> str:
    """The chart's default node groups with the first one's fields changed, as --set-json."""
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    groups = values["config"]["nodeGroups"]
    groups[0].update(changed)
    return f"config.nodeGroups={json.dumps(groups)}"


def _restart_checksum(helm: str, *args: str) -> str:
    """The Pod template's checksum of the settings only a restart applies (reloadConfig on)."""
    (deployment,) = [d for d in helm_render(helm, *args) if d["kind"] == "Deployment"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" not in annotations
    return str(annotations["checksum/restart-settings"])


# One value of each config key, as `--set` arguments: the reloadable ones (reload/fixed.py's
# RELOADABLE) and a few that only a restart applies.
RELOADABLE_CHANGES = {
    "nodeGroups": default_groups(maxSize=7),
    "pricing": "config.pricing.currency=CHF,config.pricing.volumePerGBHour=0.0001,"
    "config.pricing.flavorsPerHour.flex-8-4=0.1",
    "placeholderExpiry": "config.placeholderExpiry=20m",
    "increaseSizeWait": "config.increaseSizeWait=5s",
}
RESTART_CHANGES = {
    "cluster": "config.cluster=other",
    "cloudscale.url": "config.cloudscale.url=https://api.example.com/v1",
    "cloudscale.timeoutSeconds": "config.cloudscale.timeoutSeconds=9",
    "gpuLabel": "config.gpuLabel=example.com/gpu",
    "kubernetes": "kubernetes.driftInterval=1m",
    "tls.allowedClients": "tls.allowedClients={cluster-autoscaler,ca-2}",
}


@NEEDS_TOOL
def test_a_setting_only_a_restart_applies_rolls_the_pods_under_reload(helm: str) -> None:
    """With reloadConfig, the Pod template carries a checksum of the settings a running
    provider refuses to reload: changing one of them rolls the Pods (a new template), changing
    a reloadable one leaves the template, and the Pods reload it. The keys the chart leaves out
    are exactly the provider's RELOADABLE."""
    base = restart_checksum(helm)
    for key, change in RELOADABLE_CHANGES.items():
        option = "--set-json" if key == "nodeGroups" else "--set"
        assert restart_checksum(helm, option, change) == base, key
    for key, change in RESTART_CHANGES.items():
        assert restart_checksum(helm, "--set", change) != base, key
    assert set(RELOADABLE_CHANGES) == set(RELOADABLE)
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    omitted = re.search(r'omit \$config ((?:"\w+" ?)+)', helpers)
    assert omitted is not None and omitted.group(1).split() == [f'"{k}"' for k in RELOADABLE]


EXISTING_ACCOUNTS = [
    pytest.param(
        ["--set", "serviceAccount.create=false"], "name the existing account", id="unnamed"
    ),
    pytest.param(
        ["--set", "serviceAccount.create=false,serviceAccount.name=default"],
        "/serviceAccount/name",
        id="default",
    ),
]


@NEEDS_TOOL
@pytest.mark.parametrize(("args", "refusal"), EXISTING_ACCOUNTS)
def test_an_existing_account_is_named_and_never_the_default(
    helm: str, args: list[str], refusal: str
) -> None:
    """Without a named account the rights would land on the namespace's `default`, which every
    Pod without an account of its own runs as."""
    done = helm_template(helm, *args)
    assert done.returncode != 0 and refusal in done.stderr, done.stderr
    named = helm_render(helm, "--set", "serviceAccount.create=false,serviceAccount.name=csa")
    assert not [d for d in named if d["kind"] == "ServiceAccount"]
    assert {s["name"] for d in named if d["kind"].endswith("Binding") and "subjects" in d
            for s in d["subjects"]} == {"csa"}  # fmt: skip


def check_observability(bundle: Bundle, *, on: bool) -> None:
    """The PrometheusRule and the dashboard ConfigMap: only when asked for, and then the
    repository's files as they are, labelled for the operator and Grafana's sidecar."""
    rules = bundle.all("PrometheusRule")
    dashboards = [
        d for d in bundle.all("ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard")
    ]
    if not on:
        assert (rules, dashboards) == ([], [])
        return
    (rule,) = rules
    assert rule["spec"] == yaml.safe_load(CHART_RULES.read_text(encoding="utf-8"))
    assert rule["metadata"]["labels"]["release"] == "kps"
    (dashboard,) = dashboards
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "CA"}
    (text,) = dashboard["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD.read_text(encoding="utf-8"))


@NEEDS_TOOL
def test_helm_other_release_follows_names_and_values(helm: str) -> None:
    args, names = HELM_CASES["other-release"]
    bundle = Bundle(helm_render(helm, *args, **names))
    parsed = cloud_config(bundle)
    assert parsed["address"] == "autoscaler-cloudscale-autoscaler.autoscaling.svc:9443"
    assert parsed["grpc_timeout"] == "30s"
    assert provider_config(bundle)["listen"] == "0.0.0.0:9443"


@NEEDS_TOOL
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "config.listen=0.0.0.0:1"], "config.listen is set by the chart"),
        (["--set", "config.cloudscale.tokenFile=/x"], "config.cloudscale.tokenFile is set by"),
        (["--set", "config.metrics.listen=:1"], "config.metrics is set by the chart"),
        (["--set", "certManager.client.commonName=someone"], "is not in tls.allowedClients"),
        (["--set", "logFormat=xml"], "/logFormat"),
        (["--set", "config.cluster=Not_A_Label"], "/config/cluster"),
        (["--set", "grpcTimeout=15"], "/grpcTimeout"),
        (["--set", "kubernetes.leaderElection.enabled=false"], "more than one replica needs"),
        (["--set", "replicas=3,kubernetes.enabled=false"], "replicas is 3: more than one"),
        (["--set", "config.kubernetes.driftInterval=1m"], "config.kubernetes is set by the chart"),
        (["--set", "kubernetes.driftInterval=5"], "/kubernetes/driftInterval"),
        (["--set", "grafanaDashboard.folder=x"], "additional properties 'folder' not allowed"),
    ],
)
def test_helm_rejects_bad_values_naming_them(helm: str, args: list[str], expected: str) -> None:
    done = helm_template(helm, *args)
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr


GROUP = {"name": "workers", "minSize": 0, "maxSize": 5, "flavor": "flex-8-4", "image": "debian-12"}


@NEEDS_TOOL
@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([{**GROUP, "flavour": "flex-8-4"}],
         "at '/config/nodeGroups/0': additional properties 'flavour' not allowed"),
        ([{**GROUP, "autoscalingOptions": {"scaleDownUnneded": "5m"}}],
         "additional properties 'scaleDownUnneded' not allowed"),
        ([{**GROUP, "minSize": 12, "maxSize": 10}],
         "config.nodeGroups[0].minSize: 12 is greater than maxSize (10)"),
        ([GROUP, {**GROUP, "minSize": 1}],
         'config.nodeGroups[1].name: node group "workers" is already made by '
         "config.nodeGroups[0]"),
    ],
)  # fmt: skip
def test_helm_refuses_node_groups_the_provider_would_refuse(
    helm: str, tmp_path: Path, groups: list[Doc], expected: str
) -> None:
    """At render time, naming the value, instead of a provider crash-looping after install."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": {"cluster": "prod", "nodeGroups": groups}}))
    done = helm_template(helm, "-f", str(values))
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr


@NEEDS_TOOL
def test_helm_template_needs_no_kube_version(helm: str) -> None:
    """With helm's own default Kubernetes version (a released helm's, as the docs install)."""
    done = run([helm, "template", PROVIDER, str(CHART)])
    assert done.returncode == 0, done.stderr
    provider = Bundle(load_docs(done.stdout)).provider()
    assert provider["spec"]["replicas"] == 2
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    published = f"{PUBLISHED_IMAGE}:{chart['appVersion']}"
    assert container_of(provider)["image"] == published, "the release's image by default"


def _comparable(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    """Objects by kind and name, the generated ConfigMap's hash suffix dropped."""
    result = {}
    for doc in docs:
        name = re.sub(rf"^({PROVIDER}-config)-[a-z0-9]{{10}}$", r"\1", doc["metadata"]["name"])
        result[(doc["kind"], name)] = doc
    return result


@NEEDS_TOOL
def test_helm_and_kustomize_produce_the_same_objects(helm: str, kustomize: list[str]) -> None:
    chart = _comparable(helm_render(helm, "--set", "serviceMonitor.enabled=true"))
    kust = _comparable(kustomize_build(kustomize, OVERLAY))
    assert chart.keys() == kust.keys()
    for key in chart:
        if key[0] in {"Certificate", "Issuer"}:
            assert chart[key]["spec"] == kust[key]["spec"], key
    for kind, field in (("Service", "ports"), ("ServiceMonitor", "endpoints")):
        assert chart[(kind, PROVIDER)]["spec"][field] == kust[(kind, PROVIDER)]["spec"][field]
    assert (
        chart[("ConfigMap", f"{PROVIDER}-cloud-config")]["data"]
        == kust[("ConfigMap", f"{PROVIDER}-cloud-config")]["data"]
    )
    helm_pod, kust_pod = (d[("Deployment", PROVIDER)]["spec"] for d in (chart, kust))
    assert helm_pod["strategy"] == kust_pod["strategy"]
    for kind in ("ClusterRole", "Role"):
        for name in {key[1] for key in chart if key[0] == kind}:
            assert chart[(kind, name)]["rules"] == kust[(kind, name)]["rules"], (kind, name)
    helm_kube, kust_kube = (
        yaml.safe_load(d[("ConfigMap", f"{PROVIDER}-config")]["data"]["config.yaml"])["kubernetes"]
        for d in (chart, kust)
    )
    assert helm_kube["driftInterval"] == kust_kube["driftInterval"]
    for key in ("enabled", "leaseName", "endpointSlice", "journalConfigMap"):
        assert helm_kube["leaderElection"][key] == kust_kube["leaderElection"][key], key
    route = (d[("EndpointSlice", PROVIDER)] for d in (chart, kust))
    assert len({json.dumps([r["addressType"], r["ports"]]) for r in route}) == 1
    # The same rules in the chart's template and the base's file (kept by hand in step).
    policy = f"{PROVIDER}-leader-route"
    for field in ("matchConstraints", "variables", "validations", "failurePolicy"):
        helm_spec = chart[("ValidatingAdmissionPolicy", policy)]["spec"]
        assert helm_spec[field] == kust[("ValidatingAdmissionPolicy", policy)]["spec"][field]
    assert helm_pod["replicas"] == kust_pod["replicas"]
    for field in ("securityContext", "automountServiceAccountToken", "serviceAccountName"):
        assert helm_pod["template"]["spec"][field] == kust_pod["template"]["spec"][field], field
    helm_c, kust_c = (
        container_of(chart[("Deployment", PROVIDER)]),
        container_of(kust[("Deployment", PROVIDER)]),
    )
    for field in ("args", "ports", "livenessProbe", "readinessProbe", "securityContext"):
        assert helm_c[field] == kust_c[field], field
    assert helm_c["volumeMounts"] == kust_c["volumeMounts"]


# --- tests: the Cluster Autoscaler examples ---------------------------------------------


@functools.cache
def base_objects() -> Bundle:
    docs = [
        d for f in sorted(BASE.glob("*.yaml")) if role_of(f) == "manifests" for d in read_docs(f)
    ]
    return Bundle(docs)


def client_secret_name() -> str:
    return str(base_objects().certificate("client auth")["spec"]["secretName"])


def cloud_config_name() -> str:
    (found,) = [
        d["metadata"]["name"]
        for d in base_objects().all("ConfigMap")
        if "cloud-config" in d.get("data", {})
    ]
    return str(found)


def cloud_config_cert_dir() -> str:
    return str(cloud_config(base_objects())["cert"].rpartition("/")[0])


def test_plain_cluster_autoscaler_example_mounts_the_provider_objects() -> None:
    bundle = Bundle(read_docs(EXAMPLES / "cluster-autoscaler.yaml"))
    (deployment,) = bundle.all("Deployment")
    container = container_of(deployment)
    flags = [*container.get("command", []), *container["args"]]
    assert "--cloud-provider=externalgrpc" in flags
    (cloud_config_path,) = [f.split("=", 1)[1] for f in flags if f.startswith("--cloud-config=")]
    config_dir, _, key = cloud_config_path.rpartition("/")
    assert key == "cloud-config"
    config_volume = volume(deployment, _mount_named(deployment, config_dir))
    assert config_volume["configMap"]["name"] == cloud_config_name()
    secret_volume = volume(deployment, _mount_named(deployment, cloud_config_cert_dir()))
    assert secret_volume["secret"]["secretName"] == client_secret_name()
    reload = deployment["metadata"]["annotations"]["secret.reloader.stakater.com/reload"]
    assert reload == client_secret_name()
    (binding,) = bundle.all("ClusterRoleBinding")
    assert (
        binding["subjects"][0]["name"]
        == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    )


def _mount_named(deployment: Doc, path: str) -> str:
    (name,) = [
        m["name"] for m in container_of(deployment)["volumeMounts"] if m["mountPath"] == path
    ]
    return str(name)


def test_helm_values_example_for_the_official_chart() -> None:
    values = yaml.safe_load(
        (EXAMPLES / "cluster-autoscaler-values.yaml").read_text(encoding="utf-8")
    )
    assert values["cloudProvider"] == "externalgrpc"
    # The official chart renders no Deployment unless one of these is set.
    assert values["autoDiscovery"]["clusterName"] or values.get("autoscalingGroups")
    config_dir, _, key = values["extraArgs"]["cloud-config"].rpartition("/")
    assert key == "cloud-config"
    (mount,) = [m for m in values["extraVolumeMounts"] if m["mountPath"] == config_dir]
    (config_volume,) = [v for v in values["extraVolumes"] if v["name"] == mount["name"]]
    assert config_volume["configMap"]["name"] == cloud_config_name()
    (secret,) = values["extraVolumeSecrets"].values()
    assert secret == {"name": client_secret_name(), "mountPath": cloud_config_cert_dir()}
    reload = values["deployment"]["annotations"]["secret.reloader.stakater.com/reload"]
    assert reload == client_secret_name()


def test_restart_cronjob_targets_the_example_deployment() -> None:
    bundle = Bundle(read_docs(EXAMPLES / "cluster-autoscaler-restart-cronjob.yaml"))
    (deployment,) = Bundle(read_docs(EXAMPLES / "cluster-autoscaler.yaml")).all("Deployment")
    name = deployment["metadata"]["name"]
    values = yaml.safe_load(
        (EXAMPLES / "cluster-autoscaler-values.yaml").read_text(encoding="utf-8")
    )
    assert values["fullnameOverride"] == name
    (role,) = bundle.all("Role")
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments"],
            "resourceNames": [name],
            "verbs": ["get", "patch"],
        }
    ]
    (cronjob,) = bundle.all("CronJob")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][-1] == f"deployment/{name}"
    assert pod["serviceAccountName"] == bundle.all("ServiceAccount")[0]["metadata"]["name"]


# --- tests: Dockerfile and build context ------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            logical.append(pending.strip())
            pending = ""
    assert not pending, "a continuation line ends the Dockerfile"
    return [(w.upper(), rest.strip()) for w, _, rest in (i.partition(" ") for i in logical)]


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in dockerfile_instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def test_dockerfile_builds_in_stages_from_python_slim_to_one_trimmed_layer() -> None:
    instructions = dockerfile_instructions()
    # Pinned to bookworm: the builder's rustc-web (>= the crate's rust-version) is Debian 12's.
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in instructions
    builder, runtime, final = dockerfile_stages()
    assert builder[0] == ("FROM", "${PYTHON_IMAGE} AS builder")
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE} AS runtime")
    assert any(i == "RUN" and "pip wheel" in a for i, a in builder)
    runtime_runs = " ".join(a for i, a in runtime if i == "RUN")
    assert "--find-links=/wheels" in runtime_runs and "--no-index" in runtime_runs
    for tool in ("apt-get", "gcc", "build-essential"):
        assert tool not in runtime_runs, f"no build tools in the final image: {tool}"
    copied = [a for i, a in runtime if i == "COPY"]
    assert copied == [
        "--from=builder /wheels.sha256 /usr/local/share/cloudscale-autoscaler/wheels.sha256"
    ], "the runtime stage takes only the wheels (through a bind mount) and their checksums"
    # The image is the trimmed runtime alone: on top of the base, what the runtime stage
    # removed would still be in the base's layers.
    assert final[0] == ("FROM", "scratch")
    assert [a for i, a in final if i in ("COPY", "ADD", "RUN")] == ["--from=runtime / /"]


def test_dockerfile_runtime_matches_the_manifests() -> None:
    final = dict(dockerfile_stages()[-1][1:])
    assert final["USER"].split(":")[0] == "10001"
    assert json.loads(final["ENTRYPOINT"]) == ["cloudscale-autoscaler"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "cloudscale-autoscaler" in project["scripts"]
    cmd = json.loads(final["CMD"])
    (deployment,) = read_docs(BASE / "deployment.yaml")
    assert cmd == ["serve", "--config", f"{mount_path(deployment, 'config')}/config.yaml"]
    exposed = {int(p) for p in final["EXPOSE"].split()}
    assert exposed == {p["containerPort"] for p in container_of(deployment)["ports"]}
    security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert int(final["USER"].split(":")[1]) == security["runAsGroup"]


def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `*` and `?` stay within a path segment, `**`
    spans segments."""
    pattern = pattern.strip("/")
    out = "(?:.*/)?" if pattern.startswith("**/") else ""
    pattern = pattern.removeprefix("**/")
    for token in re.split(r"(\*\*|\*|\?)", pattern):
        out += {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return re.compile(out)


def build_context(root: Path, patterns: list[str]) -> set[str]:
    """Files Docker sends for `docker build root` under these .dockerignore patterns: the last
    pattern matching a path or one of its parents decides."""
    rules = [(p.startswith("!"), dockerignore_regex(p.lstrip("!"))) for p in patterns]

    def included(rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        keep = True
        for negated, regex in rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                keep = negated
        return keep

    def reincludes_below(rel: str) -> bool:
        return any(p.startswith("!") and p.lstrip("!").startswith(rel + "/") for p in patterns)

    found: set[str] = set()
    for directory, subdirs, files in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        base = "" if rel_dir == "." else rel_dir + "/"
        subdirs[:] = [d for d in subdirs if included(base + d) or reincludes_below(base + d)]
        found.update(base + f for f in files if included(base + f))
    return found


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        ("pyproject.toml", True),
        ("README.md", True),
        ("src/pkg/mod.py", True),
        ("src/pkg/__pycache__/mod.cpython-311.pyc", False),
        ("src/pkg.egg-info/PKG-INFO", False),
        ("rust/Cargo.lock", True),
        ("rust/src/lib.rs", True),
        ("rust/target/release/lib_transport.so", False),
        ("src/cloudscale_autoscaler/_transport.abi3.so", False),
        (".venv/bin/python", False),
        ("tests/test_x.py", False),
        ("deploy/kustomize/base/config.yaml", False),
        (".git/config", False),
    ],
)
def test_build_context_filter(tmp_path: Path, path: str, sent: bool) -> None:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text("x", encoding="utf-8")
    assert (path in build_context(tmp_path, dockerignore_patterns())) is sent


def test_build_context_holds_what_the_package_build_needs() -> None:
    context = build_context(ROOT, dockerignore_patterns())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert {"pyproject.toml", project["readme"]} <= context
    package = ROOT / "src" / "cloudscale_autoscaler"
    needed = {
        str(p.relative_to(ROOT))
        for p in package.rglob("*")
        if p.is_file() and p.suffix in {".py", ".pyi", ".typed"} and "__pycache__" not in p.parts
    }
    assert needed, "the package has sources"
    assert needed <= context, sorted(needed - context)
    assert {"src/cloudscale_autoscaler/protos/externalgrpc_pb2.py"} <= context
    crate = {str(p.relative_to(ROOT)) for p in (ROOT / "rust" / "src").rglob("*.rs")}
    assert crate and crate | {"rust/Cargo.toml", "rust/Cargo.lock"} <= context
    assert not [f for f in context if f.startswith(("tests/", ".venv", ".git/"))]


WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection", "*"})


def wide_writes(docs: list[Doc]) -> list[str]:
    """Rules that could change any Pod (a write without resourceNames), and cluster-wide
    bindings of rules that write Events: what a review of a kube-system install stops at."""
    bundle = Bundle(docs)
    found = []
    for kind in ("Role", "ClusterRole"):
        for role in bundle.all(kind):
            for rule in role["rules"]:
                writes = WRITES & set(rule["verbs"])
                if (
                    {"pods", "*"} & set(rule["resources"])
                    and writes
                    and not rule.get("resourceNames")
                ):
                    found.append(f"{kind} {role['metadata']['name']} writes any Pod: {rule}")
    for binding in bundle.all("ClusterRoleBinding"):
        role = bundle.get("ClusterRole", binding["roleRef"]["name"])
        for rule in role["rules"]:
            if {"events", "*"} & set(rule["resources"]) and WRITES & set(rule["verbs"]):
                found.append(f"ClusterRoleBinding {binding['metadata']['name']} writes Events")
    return found


@NEEDS_TOOL
@pytest.mark.parametrize("case", [*HELM_CASES, "two replicas", "kustomize base", "overlay"])
def test_no_rule_writes_any_pod_or_events_everywhere(
    helm: str, kustomize: list[str], case: str
) -> None:
    if case == "kustomize base":
        docs = kustomize_build(kustomize, BASE)
    elif case == "overlay":
        docs = kustomize_build(kustomize, OVERLAY)
    else:
        args, names = HELM_CASES.get(case, (["--set", "replicas=2"], {}))
        docs = helm_render(helm, *args, **names)
    assert wide_writes(docs) == []
