"""The config loader: every rule as a table row asserting the exact `<path>: <reason>` lines."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudscale_autoscaler.config.advice import config_warnings
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.config.values import (
    did_you_mean,
    label_value_error,
    parse_go_duration,
    parse_host_port,
    placeholder_errors,
    qualified_name_error,
    threshold_error,
)
from cloudscale_autoscaler.settings.types import (
    AutoscalingOptions,
    CloudscaleConfig,
    Config,
    ConfigError,
    KubeletConfig,
    MetricsConfig,
    NodeGroupConfig,
    Taint,
    TLSConfig,
)
from cloudscale_autoscaler.template.userdata import UserDataError, render

TOKEN = "s3cr3t-T0KEN-value-1234567890"
ENV = {"CLOUDSCALE_API_TOKEN": TOKEN}
ALLOWED = "${cluster}, ${group}, ${node_labels}, ${node_taints}, ${server_name}"
NAME_CHARSET = "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
DNS_LABEL = (
    "expected a DNS-1123 label (lowercase letters, digits and '-', "
    "starting and ending with a letter or digit)"
)

Doc = dict[str, Any]


def base_doc() -> Doc:
    """A minimal valid config; rows change one thing in it."""
    return {
        "cluster": "prod",
        "tls": {"cert": "tls/server.crt", "key": "tls/server.key", "clientCA": "tls/ca.crt"},
        "nodeGroups": [
            {"name": "workers", "minSize": 0, "maxSize": 3, "flavor": "flex-4-2", "image": "d12"},
        ],
    }


def write(tmp_path: Path, doc: Doc | str, files: dict[str, str] | None = None) -> Path:
    """The config (YAML-dumped unless a string) plus TLS placeholder files and `files`."""
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / "tls").mkdir(exist_ok=True)
        (tmp_path / "tls" / name).write_text("not checked by the loader\n")
    for name, content in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    path = tmp_path / "config.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def errors_of(path: Path, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env=ENV if env is None else env)
    assert caught.value.source == str(path)
    return caught.value.errors


Mutation = Callable[[Doc], None]


def put(*where: str | int, value: Any) -> Mutation:
    """Set a value deep in the document, creating mappings on the way."""

    def mutate(doc: Doc) -> None:
        node: Any = doc
        for key in where[:-1]:
            if isinstance(node, dict) and key not in node:
                node[key] = {}
            node = node[key]
        node[where[-1]] = value

    return mutate


def drop(*where: str | int) -> Mutation:
    def mutate(doc: Doc) -> None:
        node: Any = doc
        for key in where[:-1]:
            node = node[key]
        del node[where[-1]]

    return mutate


def group(**changes: Any) -> Mutation:
    return lambda doc: doc["nodeGroups"][0].update(changes)


def both(*mutations: Mutation) -> Mutation:
    def mutate(doc: Doc) -> None:
        for mutation in mutations:
            mutation(doc)

    return mutate


def add_groups(*names: str) -> Mutation:
    def mutate(doc: Doc) -> None:
        for name in names:
            extra = copy.deepcopy(doc["nodeGroups"][0])
            extra["name"] = name
            doc["nodeGroups"].append(extra)

    return mutate


G = "nodeGroups[0]"
K = f"{G}.kubelet"

# (mutation, exact errors). {dir} stands for the config's directory.
ROWS: list[tuple[str, Mutation, list[str]]] = [
    # --- top level
    ("cluster missing", drop("cluster"), ["cluster: required"]),
    ("cluster type", put("cluster", value=5), ["cluster: expected a string, got integer 5"]),
    ("cluster upper", put("cluster", value="Prod"), [f'cluster: invalid name "Prod": {DNS_LABEL}']),
    (
        "cluster too long",
        put("cluster", value="c" * 64),
        ["cluster: must be at most 63 characters, got 64"],
    ),
    (
        "unknown key, close",
        put("clustr", value="x"),
        ['clustr: unknown key; did you mean "cluster"?'],
    ),
    (
        "snake case key",
        put("node_groups", value=[]),
        ['node_groups: unknown key; did you mean "nodeGroups"?'],
    ),
    (
        "unknown key, far",
        put("zzz", value=1),
        [
            "zzz: unknown key; expected one of: cluster, listen, tls, cloudscale, metrics, "
            "gpuLabel, placeholderExpiry, increaseSizeWait, pricing, kubernetes, stateDir, "
            "nodeGroups"
        ],
    ),
    (
        "listen without port",
        put("listen", value="8086"),
        ['listen: invalid address "8086": expected host:port such as 0.0.0.0:8086'],
    ),
    (
        "listen port 0",
        put("listen", value="0.0.0.0:0"),
        ['listen: invalid address "0.0.0.0:0": port must be a number from 1 to 65535'],
    ),
    (
        "listen port too big",
        put("listen", value="127.0.0.1:65536"),
        ['listen: invalid address "127.0.0.1:65536": port must be a number from 1 to 65535'],
    ),
    (
        "metrics on the gRPC port",
        put("metrics", "listen", value="127.0.0.1:8086"),
        ["metrics.listen: conflicts with listen (0.0.0.0:8086)"],
    ),
    (
        "bad listen is not compared with metrics",
        both(put("listen", value="0.0.0.0:x"), put("metrics", "listen", value="0.0.0.0:8086")),
        ['listen: invalid address "0.0.0.0:x": port must be a number from 1 to 65535'],
    ),
    (
        "metrics on the default port",
        put("metrics", "listen", value="[::]:8086"),
        ["metrics.listen: conflicts with listen (0.0.0.0:8086)"],
    ),
    (
        "metrics port",
        put("metrics", "listen", value="localhost:x"),
        ['metrics.listen: invalid address "localhost:x": port must be a number from 1 to 65535'],
    ),
    (
        "gpuLabel",
        put("gpuLabel", value="gpu type"),
        [f'gpuLabel: invalid key "gpu type": the name part must consist of {NAME_CHARSET}'],
    ),
    (
        "gpuLabel set by the CCM",
        put("gpuLabel", value="node.kubernetes.io/instance-type"),
        [
            'gpuLabel: "node.kubernetes.io/instance-type" cannot be the GPU label: a well-known '
            "node label the kubelet or the cloud controller manager sets; expected a label key "
            'of your own, such as "cloudscale.ch/gpu" (the default) or "example.com/gpu"'
        ],
    ),
    (
        "gpuLabel the kubelet sets",
        put("gpuLabel", value="kubernetes.io/hostname"),
        [
            'gpuLabel: "kubernetes.io/hostname" cannot be the GPU label: a well-known node '
            "label the kubelet or the cloud controller manager sets; expected a label key of "
            'your own, such as "cloudscale.ch/gpu" (the default) or "example.com/gpu"'
        ],
    ),
    (
        "placeholderExpiry zero",
        put("placeholderExpiry", value="0s"),
        ['placeholderExpiry: must be > 0, got "0s"'],
    ),
    (
        "placeholderExpiry unitless",
        put("placeholderExpiry", value="15"),
        [
            'placeholderExpiry: invalid duration "15": expected a Go duration such as 90s, '
            "10m or 1h30m"
        ],
    ),
    (
        "placeholderExpiry integer",
        put("placeholderExpiry", value=900),
        [
            'placeholderExpiry: expected a duration with a unit such as "15m" ("900s" for 900 '
            "seconds; only 0 may stand alone), got integer 900"
        ],
    ),
    (
        "placeholderExpiry bare zero",
        put("placeholderExpiry", value=0),
        ["placeholderExpiry: must be > 0, got 0"],
    ),
    (
        "increaseSizeWait negative",
        put("increaseSizeWait", value="-1s"),
        ['increaseSizeWait: must be >= 0, got "-1s"'],
    ),
    (
        "increaseSizeWait number",
        put("increaseSizeWait", value=0.5),
        ['increaseSizeWait: expected a duration such as "50ms", got number 0.5'],
    ),
    (
        "no groups",
        put("nodeGroups", value=[]),
        ["nodeGroups: must contain at least one node group"],
    ),
    ("groups missing", drop("nodeGroups"), ["nodeGroups: required: at least one node group"]),
    (
        "groups type",
        put("nodeGroups", value="workers"),
        ['nodeGroups: expected a list, got string "workers"'],
    ),
    (
        "group type",
        put("nodeGroups", value=[5]),
        ["nodeGroups[0]: expected a mapping, got integer 5"],
    ),
    # --- tls
    (
        "tls cert missing",
        drop("tls", "cert"),
        ["tls.cert: required unless tls.insecure is true"],
    ),
    (
        "tls section missing",
        drop("tls"),
        [
            "tls.cert: required unless tls.insecure is true",
            "tls.key: required unless tls.insecure is true",
            "tls.clientCA: required unless tls.insecure is true",
        ],
    ),
    (
        "tls file missing",
        put("tls", "key", value="tls/missing.key"),
        ["tls.key: file not found: {dir}/tls/missing.key"],
    ),
    (
        "tls insecure type",
        put("tls", "insecure", value="yes"),
        ['tls.insecure: expected true or false, got string "yes"'],
    ),
    (
        "tls allowedClients item",
        put("tls", "allowedClients", value=["ca", 1]),
        ["tls.allowedClients[1]: expected a string, got integer 1"],
    ),
    (
        "tls key case",
        put("tls", "clientCa", value="x"),
        ['tls.clientCa: unknown key; did you mean "clientCA"?'],
    ),
    ("tls type", put("tls", value="on"), ['tls: expected a mapping, got string "on"']),
    # --- cloudscale
    (
        "url scheme",
        put("cloudscale", "url", value="ftp://api.example/v1"),
        [
            'cloudscale.url: invalid URL "ftp://api.example/v1": expected an http:// or '
            "https:// URL with a host"
        ],
    ),
    (
        "timeout zero",
        put("cloudscale", "timeoutSeconds", value=0),
        ["cloudscale.timeoutSeconds: must be > 0, got 0"],
    ),
    (
        "timeout string",
        put("cloudscale", "timeoutSeconds", value="30"),
        ['cloudscale.timeoutSeconds: expected a number, got string "30"'],
    ),
    (
        "flavor cache negative",
        put("cloudscale", "flavorCacheSeconds", value=-1),
        ["cloudscale.flavorCacheSeconds: must be >= 0, got -1"],
    ),
    (
        "concurrent creates",
        put("cloudscale", "maxConcurrentCreates", value=0),
        ["cloudscale.maxConcurrentCreates: must be >= 1, got 0"],
    ),
    (
        "rate negative",
        put("cloudscale", "requestsPerSecond", value=-1),
        ["cloudscale.requestsPerSecond: must be > 0, got -1"],
    ),
    (
        "token file missing",
        put("cloudscale", "tokenFile", value="secrets/token"),
        ["cloudscale.tokenFile: cannot read {dir}/secrets/token: No such file or directory"],
    ),
    # --- node group basics
    ("group name missing", drop("nodeGroups", 0, "name"), [f"{G}.name: required"]),
    (
        "group name invalid",
        group(name="gpu_nodes"),
        [f'{G}.name: invalid name "gpu_nodes": {DNS_LABEL}'],
    ),
    (
        "duplicate group",
        add_groups("gpu", "workers"),
        ['nodeGroups[2].name: duplicate of nodeGroups[0].name "workers"'],
    ),
    (
        "server name too long",
        both(put("cluster", value="c" * 30), group(name="g" * 24)),
        [
            f'{G}.name: server names "{"c" * 30}-{"g" * 24}-<8 chars>" would be 64 characters, '
            "more than the 63 a host name label allows; shorten the cluster or group name "
            "(together at most 53 characters)"
        ],
    ),
    ("minSize string", group(minSize="3"), [f'{G}.minSize: expected an integer, got string "3"']),
    ("minSize bool", group(minSize=True), [f"{G}.minSize: expected an integer, got boolean true"]),
    ("minSize float", group(minSize=1.5), [f"{G}.minSize: expected an integer, got number 1.5"]),
    ("minSize negative", group(minSize=-1), [f"{G}.minSize: must be >= 0, got -1"]),
    ("max below min", group(minSize=3, maxSize=2), [f"{G}.maxSize: must be >= minSize (3)"]),
    ("maxSize missing", drop("nodeGroups", 0, "maxSize"), [f"{G}.maxSize: required"]),
    (
        "maxSize beyond int32",
        group(maxSize=2**31),
        [f"{G}.maxSize: must be at most 2147483647, got 2147483648"],
    ),
    ("flavor missing", drop("nodeGroups", 0, "flavor"), [f"{G}.flavor: required"]),
    (
        "flavour typo",
        group(flavour="flex-4-2"),
        [f'{G}.flavour: unknown key; did you mean "flavor"?'],
    ),
    ("image empty", group(image=" "), [f"{G}.image: must not be empty"]),
    ("zone type", group(zone=1), [f"{G}.zone: expected a string, got integer 1"]),
    ("volume small", group(volumeSizeGB=5), [f"{G}.volumeSizeGB: must be >= 10, got 5"]),
    (
        "sshKeys string",
        group(sshKeys="ssh-ed25519 AAAA"),
        [f'{G}.sshKeys: expected a list, got string "ssh-ed25519 AAAA"'],
    ),
    (
        "serverGroups uuid",
        group(serverGroups=["0d0bd2a4-5de3-4bb4-8bde-3c3e5b8fa4f7", "abc"]),
        [
            f'{G}.serverGroups[1]: invalid UUID "abc": expected the form '
            "01234567-89ab-cdef-0123-456789abcdef"
        ],
    ),
    (
        "network flag string",
        group(usePublicNetwork="no"),
        [f'{G}.usePublicNetwork: expected true or false, got string "no"'],
    ),
    ("ipv6 int", group(useIPv6=1), [f"{G}.useIPv6: expected true or false, got integer 1"]),
    # --- tags and labels
    (
        "reserved tag",
        group(tags={"k8s-cluster": "other"}),
        [f"{G}.tags.k8s-cluster: reserved: the autoscaler sets this tag itself"],
    ),
    (
        "reserved request tag",
        group(tags={"k8s-autoscaler-request": "x"}),
        [f"{G}.tags.k8s-autoscaler-request: reserved: the autoscaler sets this tag itself"],
    ),
    (
        "tag value int",
        group(tags={"team": 5}),
        [f"{G}.tags.team: expected a string, got integer 5"],
    ),
    ("tags list", group(tags=["team"]), [f"{G}.tags: expected a mapping, got a list"]),
    (
        "label prefix upper",
        group(labels={"Example.com/role": "x"}),
        [
            f'{G}.labels["Example.com/role"]: invalid key "Example.com/role": prefix '
            '"Example.com" must be a lowercase DNS subdomain of at most 253 characters'
        ],
    ),
    (
        "label empty prefix",
        group(labels={"/role": "x"}),
        [
            f'{G}.labels["/role"]: invalid key "/role": prefix "" must be a lowercase DNS '
            "subdomain of at most 253 characters"
        ],
    ),
    (
        "label name too long",
        group(labels={"a" * 64: "x"}),
        [
            f'{G}.labels.{"a" * 64}: invalid key "{"a" * 64}": the name part must be at most '
            "63 characters"
        ],
    ),
    (
        "label value bad",
        group(labels={"role": "-worker"}),
        [f'{G}.labels.role: invalid value "-worker": must be empty or consist of {NAME_CHARSET}'],
    ),
    (
        "label value too long",
        group(labels={"role": "v" * 64}),
        [f'{G}.labels.role: invalid value "{"v" * 64}": must be at most 63 characters'],
    ),
    (
        "label value bool",
        group(labels={"gpu": True}),
        [f"{G}.labels.gpu: expected a string, got boolean true"],
    ),
    (
        "label the CCM writes otherwise",
        both(group(zone="lpg1"), group(labels={"topology.kubernetes.io/zone": "rma1"})),
        [
            f'{G}.labels["topology.kubernetes.io/zone"]: the cloud controller manager sets it '
            'on every new node from the server\'s zone, to "lpg1", not "rma1"'
        ],
    ),
    (
        "label the kubelet refuses",
        group(labels={"node-role.kubernetes.io/worker": ""}),
        [
            f'{G}.labels["node-role.kubernetes.io/worker"]: the kubelet refuses to start with '
            "node-role.kubernetes.io/worker in --node-labels (a node may set labels in the "
            "kubernetes.io and k8s.io namespaces only under kubelet.kubernetes.io/ and "
            "node.kubernetes.io/ and a few well-known keys), so it cannot come through "
            "${node_labels}: set such labels another way, or use a prefix of your own "
            "(node-role.example.com/worker)"
        ],
    ),
    # --- taints
    (
        "taint effect",
        group(taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedul"}]),
        [
            f'{G}.taints[0].effect: invalid effect "NoSchedul": expected one of NoSchedule, '
            "PreferNoSchedule, NoExecute"
        ],
    ),
    (
        "taint effect missing",
        group(taints=[{"key": "dedicated"}]),
        [f"{G}.taints[0].effect: required"],
    ),
    (
        "taint key invalid",
        group(taints=[{"key": "a b", "effect": "NoExecute"}]),
        [f'{G}.taints[0].key: invalid key "a b": the name part must consist of {NAME_CHARSET}'],
    ),
    (
        "taint value invalid",
        group(taints=[{"key": "a", "value": "x y", "effect": "NoExecute"}]),
        [f'{G}.taints[0].value: invalid value "x y": must be empty or consist of {NAME_CHARSET}'],
    ),
    (
        "taint key typo",
        group(taints=[{"key": "a", "valeu": "b", "effect": "NoExecute"}]),
        [f'{G}.taints[0].valeu: unknown key; did you mean "value"?'],
    ),
    (
        "taint string without effect",
        group(taints=["dedicated=gpu"]),
        [f'{G}.taints[0]: invalid taint "dedicated=gpu": expected key=value:Effect or key:Effect'],
    ),
    (
        "taint string bad effect",
        group(taints=["dedicated=gpu:Never"]),
        [
            f'{G}.taints[0]: invalid effect "Never": expected one of NoSchedule, '
            "PreferNoSchedule, NoExecute"
        ],
    ),
    (
        "taint duplicate",
        group(
            taints=["a=b:NoSchedule", "a:PreferNoSchedule", {"key": "a", "effect": "NoSchedule"}]
        ),
        [f"{G}.taints[2]: duplicate of taints[0] (same key and effect)"],
    ),
    (
        "taint type",
        group(taints=[5]),
        [f"{G}.taints[0]: expected a mapping or a string key=value:Effect, got integer 5"],
    ),
    # --- user data
    (
        "userData type",
        group(userData=5),
        [f"{G}.userData: expected a string or {{file: PATH}}, got integer 5"],
    ),
    (
        "userData placeholder",
        group(userData="#cloud-config\nhostname: ${hostname}\n"),
        [
            f"{G}.userData: line 2: unknown placeholder ${{hostname}}; allowed: {ALLOWED} "
            "(write $${ for a literal ${)"
        ],
    ),
    (
        "userData unterminated",
        group(userData="echo ${cluster\n"),
        [f'{G}.userData: line 1: unterminated placeholder "${{cluster": missing "}}"'],
    ),
    (
        "userData file missing",
        group(userData={"file": "missing.yaml"}),
        [f"{G}.userData.file: cannot read {{dir}}/missing.yaml: No such file or directory"],
    ),
    (
        "userData mapping key",
        group(userData={"path": "x"}),
        [f"{G}.userData.path: unknown key; expected one of: file", f"{G}.userData.file: required"],
    ),
    # --- kubelet
    ("maxPods zero", group(kubelet={"maxPods": 0}), [f"{K}.maxPods: must be >= 1, got 0"]),
    (
        "reserved quantity",
        group(kubelet={"systemReserved": {"memory": "12 GB"}}),
        [
            f'{K}.systemReserved.memory: invalid quantity "12 GB": expected a Kubernetes '
            "quantity such as 512Mi"
        ],
    ),
    (
        "reserved negative",
        group(kubelet={"kubeReserved": {"cpu": "-100m"}}),
        [f'{K}.kubeReserved.cpu: invalid quantity "-100m": must not be negative'],
    ),
    (
        "reserved resource",
        group(kubelet={"systemReserved": {"storage": "1Gi"}}),
        [f'{K}.systemReserved.storage: unknown key; did you mean "ephemeral-storage"?'],
    ),
    (
        "reserved value type",
        group(kubelet={"systemReserved": {"cpu": True}}),
        [f"{K}.systemReserved.cpu: expected a quantity string, got boolean true"],
    ),
    (
        "eviction percentage",
        group(kubelet={"evictionHard": {"memory.available": "150%"}}),
        [
            f'{K}.evictionHard["memory.available"]: invalid percentage "150%": '
            "must be between 0% and 100%"
        ],
    ),
    (
        # Kubelet reads ASCII digits only; such a value once passed here and then broke the
        # template RPC.
        "eviction percentage in non-ASCII digits",
        group(kubelet={"evictionHard": {"memory.available": "\u0661\u0660%"}}),
        [
            f'{K}.evictionHard["memory.available"]: invalid percentage "\u0661\u0660%": '
            "expected a number followed by %, such as 10%"
        ],
    ),
    (
        "eviction value",
        group(kubelet={"evictionHard": {"nodefs.available": "ten"}}),
        [
            f'{K}.evictionHard["nodefs.available"]: invalid threshold "ten": expected a '
            "quantity such as 100Mi or a percentage such as 10%"
        ],
    ),
    (
        "eviction signal",
        group(kubelet={"evictionHard": {"memory.avail": "1Gi"}}),
        [f'{K}.evictionHard["memory.avail"]: unknown key; did you mean "memory.available"?'],
    ),
    (
        "kubelet key",
        group(kubelet={"max_pods": 10}),
        [f'{K}.max_pods: unknown key; did you mean "maxPods"?'],
    ),
    # --- autoscaling options
    (
        "threshold range",
        group(autoscalingOptions={"scaleDownUtilizationThreshold": 1.5}),
        [f"{G}.autoscalingOptions.scaleDownUtilizationThreshold: must be between 0 and 1, got 1.5"],
    ),
    (
        "duration text",
        group(autoscalingOptions={"scaleDownUnneededTime": "10 minutes"}),
        [
            f'{G}.autoscalingOptions.scaleDownUnneededTime: invalid duration "10 minutes": '
            "expected a Go duration such as 90s, 10m or 1h30m"
        ],
    ),
    (
        "duration int",
        group(autoscalingOptions={"maxNodeStartupTime": 600}),
        [
            f"{G}.autoscalingOptions.maxNodeStartupTime: expected a duration with a unit such "
            'as "10m" ("600s" for 600 seconds; only 0 may stand alone), got integer 600'
        ],
    ),
    (
        "duration negative",
        group(autoscalingOptions={"maxNodeProvisionTime": "-5m"}),
        [f'{G}.autoscalingOptions.maxNodeProvisionTime: must not be negative, got "-5m"'],
    ),
    (
        "option bool",
        group(autoscalingOptions={"zeroOrMaxNodeScaling": "true"}),
        [f'{G}.autoscalingOptions.zeroOrMaxNodeScaling: expected true or false, got string "true"'],
    ),
    (
        "option typo",
        group(autoscalingOptions={"scaleDownUtilisationThreshold": 0.5}),
        [
            f"{G}.autoscalingOptions.scaleDownUtilisationThreshold: unknown key; "
            'did you mean "scaleDownUtilizationThreshold"?'
        ],
    ),
]


@pytest.mark.parametrize(("mutation", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_validation_table(tmp_path: Path, mutation: Mutation, expected: list[str]) -> None:
    doc = base_doc()
    mutation(doc)
    path = write(tmp_path, doc)
    assert errors_of(path) == [e.replace("{dir}", str(tmp_path)) for e in expected]


def test_base_doc_is_valid(tmp_path: Path) -> None:
    """The table's starting point must itself load, or every row would test nothing."""
    config = load_config(write(tmp_path, base_doc()), env=ENV)
    assert config.node_groups[0].name == "workers"


def test_every_error_is_collected(tmp_path: Path) -> None:
    doc = base_doc()
    doc["cluster"] = "Bad"
    doc["nodeGroups"][0].update(minSize=5, maxSize=1, flavour="x")
    doc["nodeGroups"].append({"name": "workers", "minSize": 0, "maxSize": 1})
    errors = errors_of(write(tmp_path, doc))
    assert errors == [
        f'cluster: invalid name "Bad": {DNS_LABEL}',
        f'{G}.flavour: unknown key; did you mean "flavor"?',
        f"{G}.maxSize: must be >= minSize (5)",
        "nodeGroups[1].flavor: required",
        "nodeGroups[1].image: required",
        'nodeGroups[1].name: duplicate of nodeGroups[0].name "workers"',
    ]


def test_error_message_lists_every_error_under_the_source(tmp_path: Path) -> None:
    doc = base_doc()
    doc["nodeGroups"][0]["minSize"] = -1
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env=ENV)
    assert str(caught.value) == f"{path}: invalid config:\n  {G}.minSize: must be >= 0, got -1"


# --- files and YAML ---------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert errors_of(path) == [f"{path}: cannot read: No such file or directory"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "cluster: prod\nnodeGroups:\n  - name: a: b\n",
            "invalid YAML at line 3, column 12: mapping values are not allowed here",
        ),
        (
            "cluster: prod\ntls: [a,\n",
            "invalid YAML at line 3, column 1: expected the node "
            "content, but found '<stream end>' (while parsing a flow node)",
        ),
        (
            "cluster: prod\ncluster: test\n",
            'invalid YAML at line 2, column 1: duplicate key "cluster" (first at line 1)',
        ),
        ("- cluster\n", "expected a mapping of settings at the top level, got a list"),
        ("", "expected a mapping of settings at the top level, got null"),
    ],
    ids=["mapping in scalar", "unclosed list", "duplicate key", "list", "empty"],
)
def test_yaml_problems(tmp_path: Path, text: str, reason: str) -> None:
    path = write(tmp_path, text)
    assert errors_of(path) == [f"{path}: {reason}"]


# --- a complete valid config ---------------------------------------------------------------

FULL = """
cluster: prod
listen: 127.0.0.1:9443
tls:
  cert: tls/server.crt
  key: tls/server.key
  clientCA: tls/ca.crt
  allowedClients: [cluster-autoscaler, ca.example.com]
cloudscale:
  url: http://127.0.0.1:8087/v1/
  tokenFile: token
  timeoutSeconds: 12.5
  maxConcurrentCreates: 4
  requestsPerSecond: 8
metrics:
  listen: 127.0.0.1:9090
gpuLabel: example.com/gpu
placeholderExpiry: 1h30m
nodeGroups:
  - name: workers
    minSize: 1
    maxSize: 10
    flavor: flex-8-4
    image: debian-12
    zone: lpg1
    volumeSizeGB: 50
    sshKeys: ["ssh-ed25519 AAAA user"]
    serverGroups: ["0d0bd2a4-5de3-4bb4-8bde-3c3e5b8fa4f7"]
    usePublicNetwork: false
    usePrivateNetwork: true
    useIPv6: false
    userData: {file: cloud/user-data.yaml}
    tags: {team: infra, cost-center: "42"}
    labels: {role: worker, example.com/tier: "", zz: top}
    taints:
      - {key: dedicated, value: batch, effect: NoSchedule}
      - "example.com/spot:PreferNoSchedule"
      - "flaky=yes:NoExecute"
    kubelet:
      maxPods: 58
      systemReserved: {cpu: 50m, memory: 384Mi, ephemeral-storage: 256Mi, pid: 1000}
      kubeReserved: {cpu: 100m}
      evictionHard: {memory.available: 100Mi, nodefs.available: "10%"}
    autoscalingOptions:
      scaleDownUtilizationThreshold: 0.5
      scaleDownGpuUtilizationThreshold: 1
      scaleDownUnneededTime: 10m
      scaleDownUnreadyTime: 1h30m
      maxNodeProvisionTime: 90s
      maxNodeStartupTime: 500ms
      zeroOrMaxNodeScaling: true
      ignoreDaemonSetsUtilization: false
      allowNonAtomicScaleUpToMax: true
  - name: small
    minSize: 0
    maxSize: 0
    flavor: flex-4-1
    image: custom:my-image
    autoscalingOptions: {}
"""

USER_DATA = "#cloud-config\nhostname: ${server_name}\nruncmd: [echo $HOME $${literal}]\n"


def test_full_config(tmp_path: Path) -> None:
    path = write(tmp_path, FULL, {"token": f"  {TOKEN}\n", "cloud/user-data.yaml": USER_DATA})
    os.chmod(tmp_path / "token", 0o600)
    config = load_config(path, env={})
    workers = NodeGroupConfig(
        name="workers",
        min_size=1,
        max_size=10,
        flavor="flex-8-4",
        image="debian-12",
        zone="lpg1",
        volume_size_gb=50,
        ssh_keys=("ssh-ed25519 AAAA user",),
        server_groups=("0d0bd2a4-5de3-4bb4-8bde-3c3e5b8fa4f7",),
        use_public_network=False,
        use_private_network=True,
        use_ipv6=False,
        user_data=USER_DATA,
        tags=(("cost-center", "42"), ("team", "infra")),
        labels=(("example.com/tier", ""), ("role", "worker"), ("zz", "top")),
        taints=(
            Taint("dedicated", "batch", "NoSchedule"),
            Taint("example.com/spot", "", "PreferNoSchedule"),
            Taint("flaky", "yes", "NoExecute"),
        ),
        kubelet=KubeletConfig(
            max_pods=58,
            system_reserved=(
                ("cpu", "50m"),
                ("ephemeral-storage", "256Mi"),
                ("memory", "384Mi"),
                ("pid", "1000"),
            ),
            kube_reserved=(("cpu", "100m"),),
            eviction_hard=(("memory.available", "100Mi"), ("nodefs.available", "10%")),
        ),
        autoscaling_options=AutoscalingOptions(
            scale_down_utilization_threshold=0.5,
            scale_down_gpu_utilization_threshold=1.0,
            scale_down_unneeded_seconds=600.0,
            scale_down_unready_seconds=5400.0,
            max_node_provision_seconds=90.0,
            max_node_startup_seconds=0.5,
            zero_or_max_node_scaling=True,
            ignore_daemonsets_utilization=False,
            allow_non_atomic_scale_up_to_max=True,
        ),
    )
    small = NodeGroupConfig(
        name="small",
        min_size=0,
        max_size=0,
        flavor="flex-4-1",
        image="custom:my-image",
        autoscaling_options=AutoscalingOptions(),
    )
    assert config == Config(
        cluster="prod",
        node_groups=(workers, small),
        listen="127.0.0.1:9443",
        tls=TLSConfig(
            cert=tmp_path / "tls/server.crt",
            key=tmp_path / "tls/server.key",
            client_ca=tmp_path / "tls/ca.crt",
            allowed_clients=("cluster-autoscaler", "ca.example.com"),
        ),
        cloudscale=CloudscaleConfig(
            url="http://127.0.0.1:8087/v1",
            token=TOKEN,
            token_file=tmp_path / "token",
            timeout_seconds=12.5,
            max_concurrent_creates=4,
            requests_per_second=8.0,
        ),
        metrics=MetricsConfig(listen="127.0.0.1:9090"),
        gpu_label="example.com/gpu",
        placeholder_expiry_seconds=5400.0,
    )
    # The token is kept, but never shown.
    assert config.cloudscale.token == TOKEN
    assert TOKEN not in repr(config)


def test_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, base_doc()), env=ENV)
    assert (config.listen, config.gpu_label, config.placeholder_expiry_seconds) == (
        "0.0.0.0:8086",
        "cloudscale.ch/gpu",
        900.0,
    )
    assert config.metrics == MetricsConfig(listen=None)
    assert config.cloudscale == CloudscaleConfig(token=TOKEN)
    assert config.node_groups[0] == NodeGroupConfig(
        name="workers", min_size=0, max_size=3, flavor="flex-4-2", image="d12"
    )
    assert config.node_groups[0].kubelet.eviction_hard is None


def test_insecure_needs_no_certificates(tmp_path: Path) -> None:
    doc = base_doc()
    doc["tls"] = {"insecure": True}
    config = load_config(write(tmp_path, doc), env=ENV)
    assert config.tls == TLSConfig(insecure=True)


def test_null_means_absent(tmp_path: Path) -> None:
    doc = base_doc()
    doc["metrics"] = None
    doc["nodeGroups"][0].update(zone=None, autoscalingOptions=None, kubelet=None)
    group_config = load_config(write(tmp_path, doc), env=ENV).node_groups[0]
    assert (group_config.zone, group_config.autoscaling_options) == (None, None)
    assert group_config.kubelet == KubeletConfig()


def test_a_bare_zero_is_a_zero_duration_where_zero_is_allowed(tmp_path: Path) -> None:
    """docs/configuration.md: `0` alone, quoted or not, is a zero duration (YAML reads the
    unquoted one as an integer)."""
    doc = base_doc()
    doc["increaseSizeWait"] = 0
    doc["kubernetes"] = {"driftInterval": 0, "kubeconfig": "kubeconfig"}
    doc["nodeGroups"][0]["autoscalingOptions"] = {"scaleDownUnneededTime": 0}
    config = load_config(write(tmp_path, doc, {"kubeconfig": "not read"}), env=ENV)
    assert config.increase_size_wait_seconds == 0.0
    assert config.kubernetes is not None and config.kubernetes.drift_interval_seconds == 0.0
    options = config.node_groups[0].autoscaling_options
    assert options is not None and options.scale_down_unneeded_seconds == 0.0


# --- kubelet configFile ------------------------------------------------------------------

KUBELET_FILE = """
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
maxPods: 80
systemReserved: {cpu: 100m, memory: 256Mi}
kubeReserved: {memory: 512Mi}
evictionHard: {memory.available: 200Mi, imagefs.available: "15%"}
"""


def kubelet_config(tmp_path: Path, block: Doc, text: str = KUBELET_FILE) -> Path:
    doc = base_doc()
    doc["nodeGroups"][0]["kubelet"] = block
    return write(tmp_path, doc, {"kubelet.yaml": text})


def test_kubelet_file_alone(tmp_path: Path) -> None:
    path = kubelet_config(tmp_path, {"configFile": "kubelet.yaml"})
    assert load_config(path, env=ENV).node_groups[0].kubelet == KubeletConfig(
        max_pods=80,
        system_reserved=(("cpu", "100m"), ("memory", "256Mi")),
        kube_reserved=(("memory", "512Mi"),),
        eviction_hard=(("imagefs.available", "15%"), ("memory.available", "200Mi")),
    )


def test_kubelet_block_overrides_file_key_by_key(tmp_path: Path) -> None:
    block = {
        "configFile": "kubelet.yaml",
        "maxPods": 30,
        "systemReserved": {"memory": "1Gi", "pid": 500},
        "evictionHard": {"memory.available": "5%"},
    }
    path = kubelet_config(tmp_path, block)
    assert load_config(path, env=ENV).node_groups[0].kubelet == KubeletConfig(
        max_pods=30,
        system_reserved=(("cpu", "100m"), ("memory", "1Gi"), ("pid", "500")),
        kube_reserved=(("memory", "512Mi"),),
        eviction_hard=(("imagefs.available", "15%"), ("memory.available", "5%")),
    )


def test_kubelet_file_without_eviction_keeps_defaults(tmp_path: Path) -> None:
    text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 50\n"
    path = kubelet_config(tmp_path, {"configFile": "kubelet.yaml"}, text)
    kubelet = load_config(path, env=ENV).node_groups[0].kubelet
    assert (kubelet.max_pods, kubelet.eviction_hard) == (50, None)


def test_kubelet_empty_eviction_map_replaces_defaults(tmp_path: Path) -> None:
    """`evictionHard: {}` is given (no thresholds at all), which is not the same as absent."""
    path = kubelet_config(tmp_path, {"evictionHard": {}})
    assert load_config(path, env=ENV).node_groups[0].kubelet.eviction_hard == ()


KF = f"{K}.configFile(kubelet.yaml)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            KUBELET_FILE.replace("cpu: 100m", "cpu: 1 core"),
            [
                f'{KF}.systemReserved.cpu: invalid quantity "1 core": expected a Kubernetes '
                "quantity such as 512Mi"
            ],
        ),
        (
            KUBELET_FILE.replace("v1beta1", "v1"),
            [
                f'{KF}.apiVersion: expected "kubelet.config.k8s.io/v1beta1", got string '
                '"kubelet.config.k8s.io/v1"'
            ],
        ),
        (
            KUBELET_FILE.replace("kind: KubeletConfiguration\n", ""),
            [f'{KF}.kind: expected "KubeletConfiguration", got nothing'],
        ),
        (
            KUBELET_FILE.replace("maxPods: 80", "maxPods: eighty"),
            [f'{KF}.maxPods: expected an integer, got string "eighty"'],
        ),
        (
            KUBELET_FILE.replace('"15%"', '"115%"'),
            [
                f'{KF}.evictionHard["imagefs.available"]: invalid percentage "115%": '
                "must be between 0% and 100%"
            ],
        ),
        (
            "kind: [",
            [
                f"{KF}: invalid YAML at line 1, column 8: expected the node content, but found "
                "'<stream end>' (while parsing a flow node)"
            ],
        ),
        ("- a\n", [f"{KF}: expected a KubeletConfiguration mapping, got a list"]),
    ],
    ids=["quantity", "apiVersion", "kind", "maxPods", "percentage", "yaml", "list"],
)
def test_kubelet_file_errors(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = kubelet_config(tmp_path, {"configFile": "kubelet.yaml"}, text)
    assert errors_of(path) == expected


def test_kubelet_file_missing(tmp_path: Path) -> None:
    path = kubelet_config(tmp_path, {"configFile": "other.yaml"})
    assert errors_of(path) == [
        f"{K}.configFile: cannot read {tmp_path}/other.yaml: No such file or directory"
    ]


# --- user data -----------------------------------------------------------------------------


def test_user_data_file_is_read_relative_to_the_config(tmp_path: Path) -> None:
    doc = base_doc()
    doc["nodeGroups"][0]["userData"] = {"file": "ud/init.sh"}
    path = write(tmp_path, doc, {"ud/init.sh": "#!/bin/sh\necho ${group} $PATH\n"})
    assert load_config(path, env=ENV).node_groups[0].user_data == "#!/bin/sh\necho ${group} $PATH\n"


def test_user_data_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    doc = base_doc()
    doc["nodeGroups"][0]["userData"] = {"file": "init.sh"}
    path = write(tmp_path, doc, {"init.sh": "#!/bin/sh\n\necho ${cluster} ${zone} ${ group}\n"})
    assert errors_of(path) == [
        f"{G}.userData(init.sh): line 3: unknown placeholder ${{zone}}; allowed: {ALLOWED} "
        "(write $${ for a literal ${)",
        f"{G}.userData(init.sh): line 3: unknown placeholder ${{ group}}; allowed: {ALLOWED} "
        "(write $${ for a literal ${)",
    ]


TEMPLATES = [
    "plain text",
    "$HOME and $ alone and ${cluster}",
    "${node_labels}|${node_taints}|${server_name}|${group}|${cluster}",
    "escaped $${not_a_placeholder} stays",
    "$$${group}",
    "${unknown}",
    "${}",
    "${cluster",
    "${cluster\n}",
    "${Cluster}",
]


@pytest.mark.parametrize("template", TEMPLATES)
def test_loader_accepts_exactly_what_the_engine_can_render(template: str) -> None:
    """The loader's check and template/userdata.render must agree on the grammar."""
    values = dict.fromkeys(("node_labels", "node_taints", "server_name", "group", "cluster"), "v")
    try:
        render(template, values)
        renders = True
    except UserDataError:
        renders = False
    assert (placeholder_errors(template) == []) == renders


# --- the token -----------------------------------------------------------------------------


def with_token_file(tmp_path: Path, content: str, mode: int = 0o600) -> Path:
    doc = base_doc()
    doc["cloudscale"] = {"tokenFile": "secret/token"}
    path = write(tmp_path, doc, {"secret/token": content})
    os.chmod(tmp_path / "secret/token", mode)
    return path


def test_token_from_file_is_stripped_and_wins_over_env(tmp_path: Path) -> None:
    path = with_token_file(tmp_path, f"\n {TOKEN} \n")
    config = load_config(path, env={"CLOUDSCALE_API_TOKEN": "from-env-xxxxxxxx"})
    assert config.cloudscale.token == TOKEN
    assert config.cloudscale.token_file == tmp_path / "secret/token"


def test_token_from_env(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, base_doc()), env={"CLOUDSCALE_API_TOKEN": f"{TOKEN}\n"})
    assert (config.cloudscale.token, config.cloudscale.token_file) == (TOKEN, None)


def test_no_token(tmp_path: Path) -> None:
    assert errors_of(write(tmp_path, base_doc()), env={}) == [
        "cloudscale.tokenFile: no API token: set cloudscale.tokenFile or the "
        "CLOUDSCALE_API_TOKEN environment variable"
    ]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("\n  \n", "{file} is empty"),
        (f"Bearer {TOKEN}\n", "{file} must contain only the token, on one line"),
        (f"{TOKEN}\n{TOKEN}\n", "{file} must contain only the token, on one line"),
    ],
    ids=["empty", "bearer prefix", "two lines"],
)
def test_bad_token_file_never_shows_the_token(tmp_path: Path, content: str, reason: str) -> None:
    path = with_token_file(tmp_path, content)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    file = tmp_path / "secret/token"
    assert caught.value.errors == [f"cloudscale.tokenFile: {reason.format(file=file)}"]
    assert TOKEN not in str(caught.value)


def test_unreadable_token_file(tmp_path: Path) -> None:
    doc = base_doc()
    doc["cloudscale"] = {"tokenFile": "tokendir"}
    (tmp_path / "tokendir").mkdir()
    assert errors_of(write(tmp_path, doc)) == [
        f"cloudscale.tokenFile: cannot read {tmp_path}/tokendir: Is a directory"
    ]


def test_token_never_in_errors_of_a_broken_config(tmp_path: Path) -> None:
    doc = base_doc()
    doc["cloudscale"] = {"tokenFile": "secret/token", "url": "nope", "timeoutSeconds": -1}
    doc["nodeGroups"][0]["minSize"] = "zero"
    path = write(tmp_path, doc, {"secret/token": TOKEN})
    os.chmod(tmp_path / "secret/token", 0o600)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env=ENV)
    assert len(caught.value.errors) == 3
    assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value)


def test_token_file_readable_by_others_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = with_token_file(tmp_path, TOKEN, mode=0o644)
    with caplog.at_level(logging.WARNING, logger="cloudscale_autoscaler.config.loader"):
        load_config(path, env={})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"API token file {tmp_path}/secret/token is readable by others (mode 644); chmod 600 it"
    ]
    assert TOKEN not in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file a foreign group needs root")
def test_token_file_readable_by_a_foreign_group_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = with_token_file(tmp_path, TOKEN, mode=0o640)
    token = tmp_path / "secret/token"
    foreign = max({os.getegid(), *os.getgroups()}) + 1
    os.chown(token, -1, foreign)
    with caplog.at_level(logging.WARNING, logger="cloudscale_autoscaler.config.loader"):
        load_config(path, env={})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"API token file {token} is readable by group {foreign}, which this process is not "
        "in (mode 640); chmod 600 it"
    ]


@pytest.mark.parametrize("mode", [0o600, 0o440, 0o400])
def test_private_or_own_group_token_file_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    # 0440 with our own group is how a Kubernetes Secret reaches a non-root container.
    path = with_token_file(tmp_path, TOKEN, mode=mode)
    with caplog.at_level(logging.WARNING):
        load_config(path, env={})
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- the pure validators -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("2h45m30.5s", 9930.5),
        ("1m.5s", 60.5),
        ("100us", 0.0001),
        ("100µs", 0.0001),
        ("250ns", 2.5e-7),
        ("-1m", -60.0),
        ("+3s", 3.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "1d", "m", "1h 30m", "1.2.3s", "s10", "--1s", ".s"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="expected a Go duration such as 90s, 10m or 1h30m"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:8086", ("0.0.0.0", 8086)),
        ("localhost:1", ("localhost", 1)),
        ("[::]:65535", ("[::]", 65535)),
        ("[::1]:8080", ("[::1]", 8080)),
        ("autoscaler.kube-system.svc:443", ("autoscaler.kube-system.svc", 443)),
    ],
)
def test_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[:::1]:80", '"[:::1]" is not an IPv6 address'),
        ("999.1.1.1:80", '"999.1.1.1" is not an IPv4 address'),
        ("10.0.1:80", '"10.0.1" is not an IPv4 address'),
        ("::1:80", "host must be an IP address, a host name, or an IPv6 address in brackets"),
        ("host_name:80", "host must be an IP address, a host name, or an IPv6 address in brackets"),
        ("host:-1", "port must be a number from 1 to 65535"),
        (":80", "expected host:port such as 0.0.0.0:8086"),
    ],
)
def test_bad_host_port(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_host_port(text)
    assert str(caught.value) == f'invalid address "{text}": {reason}'


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("role", True),
        ("node.kubernetes.io/instance-type", True),
        ("example.com/Role_1.x", True),
        ("a" * 63, True),
        ("a" * 64, False),
        (("d" * 63 + ".") * 3 + "d" * 61 + "/x", True),  # a 253-character prefix
        (("d" * 63 + ".") * 3 + "d" * 62 + "/x", False),
        ("-role", False),
        ("role-", False),
        ("example.com/", False),
        ("a/b/c", False),
        ("", False),
        ("ex_ample.com/role", False),
    ],
)
def test_qualified_names(key: str, ok: bool) -> None:
    assert (qualified_name_error(key) is None) == ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("", True),
        ("a", True),
        ("v1.2_3-x", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("_x", False),
        ("a b", False),
        ("ä", False),
    ],
)
def test_label_values(value: str, ok: bool) -> None:
    assert (label_value_error(value) is None) == ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("100Mi", True),
        ("0", True),
        ("10%", True),
        ("0%", True),
        ("100%", True),
        ("7.5%", True),
        ("100.1%", False),
        ("%", False),
        ("-5%", False),
        ("-1Mi", False),
        ("lots", False),
    ],
)
def test_eviction_thresholds(value: str, ok: bool) -> None:
    assert (threshold_error(value) is None) == ok


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("flavour", "flavor"),
        ("min_size", "minSize"),
        ("MINSIZE", "minSize"),
        ("volumeSizeGb", "volumeSizeGB"),
        ("usePublicNetworks", "usePublicNetwork"),
        ("ephemeral_storage", "ephemeral-storage"),
        ("completely-different", None),
    ],
)
def test_did_you_mean(key: str, suggestion: str | None) -> None:
    allowed = ["flavor", "minSize", "volumeSizeGB", "usePublicNetwork", "ephemeral-storage"]
    assert did_you_mean(key, allowed) == suggestion


def test_example_config_is_valid(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """examples/ must load, without a warning, once the development certificates exist beside
    it and the token is in the environment, as its comments say (file modes as git checks
    them out: a token file there would be world-readable)."""
    from cloudscale_autoscaler.commands.certs import certs_command

    examples = Path(__file__).parent.parent / "examples"
    copy_dir = tmp_path / "examples"
    copy_dir.mkdir()
    for source in examples.iterdir():
        (copy_dir / source.name).write_bytes(source.read_bytes())
        os.chmod(copy_dir / source.name, 0o644)
    assert certs_command(tmp_path / "certs" / "dev", [], []) == 0
    caplog.set_level(logging.WARNING)
    config = load_config(copy_dir / "config.yaml", env={"CLOUDSCALE_API_TOKEN": "anything"})
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    # Nor what check-config and serve warn about, so the example's commands stay quiet.
    assert config_warnings(config) == []
    assert [g.name for g in config.node_groups] == ["workers", "gpu", "private"]
    assert config.pricing is not None and config.pricing.currency == "CHF"
    assert config.node_groups[2].interfaces is not None
    assert config.tls.cert == tmp_path / "certs/dev/server.crt"
    workers = config.node_groups[0]
    assert workers.kubelet.system_reserved == (
        ("cpu", "100m"),
        ("ephemeral-storage", "1Gi"),
        ("memory", "512Mi"),
    )
    assert workers.user_data is not None and "${node_labels}" in workers.user_data
