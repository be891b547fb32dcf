"""The chart refuses at `helm template` what the provider would refuse at start, so a bad
value fails `helm install` instead of crash-looping the Pods after it.

values.schema.json comes from the loader's own definitions (tools/genschema.py,
cloudscale_autoscaler.config.schema): the committed file is what the tool writes. Then one
table holds the chart and the loader to each other, value by value: helm's verdict on the
values (its JSON Schema validation, then the templates' checks) against the real loader's on
the config file the chart renders from them. What neither the schema nor a template can check
is listed in docs/deployment.md; each such row names the words that list uses.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.tools import INSTALL_TIMEOUT_SECONDS

from cloudscale_autoscaler.config.groups import GROUP_KEYS, OPTION_KEYS
from cloudscale_autoscaler.config.kubelet import BLOCK_KEYS
from cloudscale_autoscaler.config.loader import CLOUDSCALE_KEYS, TOP_KEYS, load_config
from cloudscale_autoscaler.config.schema import config_schema
from cloudscale_autoscaler.settings.types import ConfigError
from cloudscale_autoscaler.transport.certs import mint_dev_pki

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "cloudscale-autoscaler"
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"
NEEDS_HELM = pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)
UUID = "01234567-89ab-cdef-0123-456789abcdef"

Doc = dict[str, Any]


def test_committed_schema_is_the_generated_one() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "genschema.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_schema_knows_exactly_the_keys_the_loader_knows() -> None:
    """Unknown keys are refused (`flavour:` fails helm install); none the provider knows is."""
    config = config_schema()
    assert config["additionalProperties"] is False
    assert list(config["properties"]) == list(TOP_KEYS)
    assert list(config["properties"]["cloudscale"]["properties"]) == list(CLOUDSCALE_KEYS)
    group = config["properties"]["nodeGroups"]["items"]
    assert group["additionalProperties"] is False
    assert list(group["properties"]) == list(GROUP_KEYS)
    assert list(group["properties"]["kubelet"]["properties"]) == list(BLOCK_KEYS)
    assert list(group["properties"]["autoscalingOptions"]["properties"]) == list(OPTION_KEYS)
    chart = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    assert list(chart["properties"]) == list(TOP_KEYS)


# --- the chart's verdict against the loader's ---------------------------------------------

GROUP: Doc = {"name": "workers", "minSize": 0, "maxSize": 5, "flavor": "flex-8-4",
              "image": "debian-12", "zone": "lpg1"}  # fmt: skip
PRICING: Doc = {"currency": "CHF", "flavorsPerHour": {"flex-8-4": "0.1"}, "volumePerGBHour": 0}


def group(**changes: Any) -> Doc:
    """The chart's values with one node group, GROUP changed by `changes` (None: left out)."""
    changed = {key: value for key, value in {**GROUP, **changes}.items() if value is not None}
    return {"config": {"nodeGroups": [changed]}}


def config(**changes: Any) -> Doc:
    return {"config": changes}


def election(**changes: Any) -> Doc:
    return {"kubernetes": {"leaderElection": changes}}


# (id, values over the chart's defaults, where helm refuses: the words of its message, or
# None when it accepts; for a value only the provider refuses, the words docs/deployment.md
# lists it with, else None: then the loader accepts it too).
Row = tuple[str, Doc, str | None, str | None]
ROWS: list[Row] = [
    # Accepted by both.
    ("defaults", {}, None, None),
    ("bare zero wait", config(increaseSizeWait=0), None, None),
    ("durations", config(placeholderExpiry="1h30m", increaseSizeWait="250ms"), None, None),
    ("option zero", group(autoscalingOptions={"scaleDownUnneededTime": 0}), None, None),
    ("priced", config(pricing=PRICING), None, None),
    ("zones", group(zone=None, zones=["lpg1", "rma1"]), None, None),
    ("private network", group(interfaces=["public", {"network": "k8s", "subnet": UUID}]),
     None, None),
    ("labels and taints", group(labels={"example.com/role": "gpu", "tier": ""},
     taints=["dedicated=gpu:NoSchedule", {"key": "spot", "effect": "PreferNoSchedule"}]),
     None, None),
    ("kubelet", group(kubelet={"maxPods": 60, "systemReserved": {"cpu": "100m", "memory": "1Gi"},
     "evictionHard": {"memory.available": "500Mi", "nodefs.available": "10%"}}), None, None),
    ("gpu label", config(gpuLabel="example.com/gpu"), None, None),
    ("drift", {"kubernetes": {"driftInterval": "0s", "driftTolerance": "5%"}}, None, None),
    ("lease", election(leaseDuration="1m", renewDeadline="40s", retryPeriod="500ms"),
     None, None),
    # Refused by values.schema.json.
    ("no groups", config(nodeGroups=[]), "minItems: got 0, want 1", None),
    ("a day", config(placeholderExpiry="1d"), "/config/placeholderExpiry", None),
    ("zero expiry", config(placeholderExpiry=0), "/config/placeholderExpiry", None),
    ("zero expiry text", config(placeholderExpiry="0m0s"), "/config/placeholderExpiry", None),
    ("number wait", config(increaseSizeWait=50), "/config/increaseSizeWait", None),
    ("negative option", group(autoscalingOptions={"scaleDownUnneededTime": "-5m"}),
     "/autoscalingOptions/scaleDownUnneededTime", None),
    ("threshold", group(autoscalingOptions={"scaleDownUtilizationThreshold": 1.5}),
     "/autoscalingOptions/scaleDownUtilizationThreshold", None),
    ("tolerance number", {"kubernetes": {"driftTolerance": "3"}}, "/kubernetes/driftTolerance",
     None),
    ("tolerance 100%", {"kubernetes": {"driftTolerance": "100%"}}, "/kubernetes/driftTolerance",
     None),
    ("drift a day", {"kubernetes": {"driftInterval": "1d"}}, "/kubernetes/driftInterval", None),
    ("zero lease", election(leaseDuration="0s"), "/kubernetes/leaderElection/leaseDuration",
     None),
    ("gpu label the kubelet sets", config(gpuLabel="kubernetes.io/hostname"), "/config/gpuLabel",
     None),
    ("gpu label the kubelet refuses", config(gpuLabel="node-role.kubernetes.io/gpu"),
     "/config/gpuLabel", None),
    ("label the kubelet refuses", group(labels={"node-role.kubernetes.io/worker": ""}),
     "invalid propertyName 'node-role.kubernetes.io/worker'", None),
    ("label value", group(labels={"tier": "a b"}), "/labels/tier", None),
    ("cluster", config(cluster="Prod"), "/config/cluster", None),
    ("group name", group(name="Workers"), "/config/nodeGroups/0/name", None),
    ("negative min", group(minSize=-1), "/config/nodeGroups/0/minSize", None),
    ("max beyond int32", group(maxSize=2**31), "/config/nodeGroups/0/maxSize", None),
    ("small volume", group(volumeSizeGB=5), "/config/nodeGroups/0/volumeSizeGB", None),
    ("zone and zones", group(zones=["rma1"]), "/config/nodeGroups/0", None),
    ("empty zones", group(zone=None, zones=[]), "/config/nodeGroups/0/zones", None),
    ("zone twice", group(zone=None, zones=["lpg1", "lpg1"]), "/config/nodeGroups/0/zones", None),
    ("anti-affinity and server groups", group(antiAffinity=True, serverGroups=[UUID]),
     "/config/nodeGroups/0", None),
    ("anti-affinity without a zone", group(zone=None, antiAffinity=True),
     "/config/nodeGroups/0", None),
    ("server group uuid", group(serverGroups=["not-a-uuid"]), "/serverGroups/0", None),
    ("interfaces and flags", group(interfaces=["public"], usePublicNetwork=True),
     "/config/nodeGroups/0", None),
    ("private network without zone", group(zone=None, interfaces=[{"network": "k8s"}]),
     "/config/nodeGroups/0", None),
    ("public subnet", group(interfaces=[{"network": "public", "subnet": UUID}]),
     "/interfaces/0", None),
    ("fixed address", group(interfaces=[{"network": "k8s", "addresses": ["10.0.0.1"]}]),
     "/interfaces/0", None),
    ("taint text", group(taints=["dedicated"]), "/taints/0", None),
    ("taint effect", group(taints=[{"key": "a", "effect": "Sometimes"}]), "/taints/0", None),
    ("reserved tag", group(tags={"k8s-cluster": "x"}), "invalid propertyName 'k8s-cluster'",
     None),
    ("max pods", group(kubelet={"maxPods": 0}), "/kubelet/maxPods", None),
    ("quantity", group(kubelet={"systemReserved": {"memory": "12 GB"}}),
     "/kubelet/systemReserved/memory", None),
    ("negative quantity", group(kubelet={"kubeReserved": {"cpu": "-100m"}}),
     "/kubelet/kubeReserved/cpu", None),
    ("threshold percent", group(kubelet={"evictionHard": {"memory.available": "101%"}}),
     "/kubelet/evictionHard/memory.available", None),
    ("eviction signal", group(kubelet={"evictionHard": {"memory.free": "1Gi"}}),
     "invalid propertyName 'memory.free'", None),
    ("currency", config(pricing={**PRICING, "currency": "chf"}), "/config/pricing/currency",
     None),
    ("price", config(pricing={**PRICING, "flavorsPerHour": {"flex-8-4": "-1"}}),
     "/config/pricing/flavorsPerHour/flex-8-4", None),
    ("no volume price", config(pricing={"currency": "CHF", "flavorsPerHour": {"flex-8-4": 1}}),
     "/config/pricing", None),
    ("timeout", config(cloudscale={"timeoutSeconds": 0}), "/config/cloudscale/timeoutSeconds",
     None),
    ("creates", config(cloudscale={"maxConcurrentCreates": 0}),
     "/config/cloudscale/maxConcurrentCreates", None),
    ("url", config(cloudscale={"url": "ftp://api.example"}), "/config/cloudscale/url", None),
    # Refused by the templates' checks.
    ("min above max", group(minSize=6), "config.nodeGroups[0].minSize: 6 is greater than", None),
    ("name twice", {"config": {"nodeGroups": [GROUP, GROUP]}},
     'config.nodeGroups[1].name: node group "workers" is already made by', None),
    ("zone name twice", {"config": {"nodeGroups": [
        group(zone=None, zones=["lpg1"])["config"]["nodeGroups"][0],
        {**GROUP, "name": "workers-lpg1"}]}},
     'config.nodeGroups[1].name: node group "workers-lpg1" is already made by', None),
    ("server name", config(cluster="c" * 47), "would be 64 characters", None),
    ("unpriced flavor", config(pricing={**PRICING, "flavorsPerHour": {"flex-4-1": "0.1"}}),
     'config.pricing.flavorsPerHour: no price for flavor "flex-8-4"', None),
    ("lease within renew", election(leaseDuration="10s"),
     "kubernetes.leaderElection.leaseDuration: must be greater than renewDeadline", None),
    ("renew within retry", election(renewDeadline="2s"),
     "kubernetes.leaderElection.renewDeadline: must be greater than 1.2 x retryPeriod", None),
    # Refused only by the provider: listed in docs/deployment.md.
    ("label the kubelet sets", group(labels={"kubernetes.io/hostname": "x"}), None,
     "a label on a key the kubelet or the cloud controller manager sets"),
    ("zone label without zone", group(zone=None, labels={"topology.kubernetes.io/zone": "lpg1"}),
     None, "a label on a key the kubelet or the cloud controller manager sets"),
    ("placeholder", group(userData="hostname: ${zone}"), None, "a `${...}` placeholder"),
    ("user data file", group(userData={"file": "user-data.yaml"}), None,
     "files a group names (`userData.file`, `kubelet.configFile`)"),
    ("kubelet file", group(kubelet={"configFile": "kubelet.yaml"}), None,
     "files a group names (`userData.file`, `kubelet.configFile`)"),
    ("taint twice", group(taints=["a:NoSchedule", "a=b:NoSchedule"]), None,
     "two taints with the same key and effect"),
    ("network twice", group(interfaces=[{"network": "k8s"}, {"network": "k8s"}]), None,
     "the same network twice"),
    ("longest duration", config(placeholderExpiry="2562048h"), None,
     "a duration beyond 292 years"),
    ("dearest price", config(pricing={**PRICING, "flavorsPerHour": {"flex-8-4": "2000000"}}),
     None, "a price written as a string above 1000000"),
]  # fmt: skip


def _merge(base: Doc, over: Doc) -> Doc:
    """Helm's merge of values: mappings key by key, a null deletes, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _helm(helm: str, values: Doc, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # Groups are given whole, as lists are in helm's merge; a removed key is left out.
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(_merge(defaults, values)))
    command = [helm, "template", "cloudscale-autoscaler", str(CHART), "-n", "kube-system"]
    return subprocess.run(
        [*command, "-f", str(file)], capture_output=True, text=True, timeout=60, check=False
    )


def _rendered_config(helm: str, tmp_path: Path) -> Doc:
    done = _helm(helm, {}, tmp_path)
    assert done.returncode == 0, done.stderr
    (text,) = [
        doc["data"]["config.yaml"]
        for doc in yaml.safe_load_all(done.stdout)
        if doc and doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {})
    ]
    rendered: Doc = yaml.safe_load(text)
    return rendered


def _as_rendered(rendered: Doc, values: Doc) -> Doc:
    """The config file the chart writes for `values`: the default render, with `config` and
    the `kubernetes` values merged in where the chart puts them."""
    result = _merge(rendered, values.get("config", {}))
    kubernetes = values.get("kubernetes", {})
    section = result["kubernetes"]
    for key in ("driftInterval", "driftTolerance"):
        if key in kubernetes:
            section[key] = kubernetes[key]
    section["leaderElection"].update(kubernetes.get("leaderElection", {}))
    return result


def _loader_errors(config_doc: Doc, tmp_path: Path) -> list[str]:
    """The real loader's errors for `config_doc`, its Pod files recreated under tmp_path."""
    local = copy.deepcopy(config_doc)
    pki = mint_dev_pki()
    for key, content in (("cert", pki.server.cert_pem()), ("key", pki.server.key_pem()),
                         ("clientCA", pki.ca.cert_pem())):  # fmt: skip
        path = tmp_path / local["tls"][key].lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        local["tls"][key] = str(path)
    local["cloudscale"]["tokenFile"] = str(tmp_path / "token")
    (tmp_path / "token").write_text("token\n")
    (tmp_path / "token").chmod(0o600)
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(local))
    try:
        load_config(file, env={})
    except ConfigError as error:
        return error.errors
    return []


@pytest.fixture(scope="module")
def rendered(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Doc:
    return _rendered_config(helm, tmp_path_factory.mktemp("default"))


@NEEDS_HELM
@pytest.mark.parametrize(("values", "refused", "listed"), [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])  # fmt: skip
def test_the_chart_refuses_what_the_provider_refuses(
    helm: str, rendered: Doc, tmp_path: Path, values: Doc, refused: str | None, listed: str | None
) -> None:
    done = _helm(helm, values, tmp_path)
    errors = _loader_errors(_as_rendered(rendered, values), tmp_path)
    if refused is not None:
        assert done.returncode != 0, "helm accepted it"
        assert refused in done.stderr, done.stderr
        assert errors, "the provider would accept it: the chart must not refuse it"
        return
    assert done.returncode == 0, done.stderr
    if listed is None:
        assert errors == []
    else:
        assert errors, "the provider accepts it too: not a gap of the chart's"
        assert listed in _unchecked_list(), f"docs/deployment.md does not list {listed!r}"


def _unchecked_list() -> str:
    text = DEPLOYMENT_DOC.read_text()
    section = text.split("What the chart cannot check", 1)[1].split("\n#", 1)[0]
    return " ".join(section.split())
