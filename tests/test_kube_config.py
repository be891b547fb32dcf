"""The `kubernetes:` config section, table-tested through the real loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudscale_autoscaler.config.kubernetes import kubernetes_text
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.settings.types import ConfigError, KubernetesConfig, LeaderElectionConfig

ENV = {"CLOUDSCALE_API_TOKEN": "token"}
LE = "kubernetes.leaderElection"


def write(tmp_path: Path, kubernetes: Any) -> Path:
    doc: dict[str, Any] = {
        "cluster": "prod",
        "tls": {"insecure": True},
        "nodeGroups": [{"name": "w", "minSize": 0, "maxSize": 1, "flavor": "f", "image": "i"}],
    }
    if kubernetes is not ...:
        doc["kubernetes"] = kubernetes
    (tmp_path / "kubeconfig").write_text("not read by the loader\n")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_absent_section_means_no_kubernetes(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ...), env=ENV).kubernetes is None


def test_empty_section_takes_the_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, {"leaderElection": {}}), env=ENV)
    assert config.kubernetes == KubernetesConfig()
    assert (
        kubernetes_text(config.kubernetes)
        == "in-cluster, drift every 300s (3%), no leader election"
    )
    assert config.kubernetes.leader_election == LeaderElectionConfig(
        enabled=False,
        lease_name="cloudscale-autoscaler",
        namespace=None,
        lease_duration_seconds=15.0,
        renew_deadline_seconds=10.0,
        retry_period_seconds=2.0,
    )
    assert (config.kubernetes.drift_interval_seconds, config.kubernetes.drift_tolerance) == (
        300.0,
        0.03,
    )


def test_full_section(tmp_path: Path) -> None:
    section = {
        "kubeconfig": "kubeconfig",
        "driftInterval": "0s",
        "driftTolerance": "5%",
        "leaderElection": {
            "enabled": True,
            "leaseName": "ha",
            "namespace": "autoscaling",
            "leaseDuration": "3s",
            "renewDeadline": "2s",
            "retryPeriod": "500ms",
        },
    }
    config = load_config(write(tmp_path, section), env=ENV)
    assert kubernetes_text(config.kubernetes) == (
        f"kubeconfig {tmp_path / 'kubeconfig'}, no drift, leader election on Lease "
        "autoscaling/ha (3s/2s/0.5s)"
    )
    assert config.kubernetes == KubernetesConfig(
        kubeconfig=tmp_path / "kubeconfig",
        drift_interval_seconds=0.0,
        drift_tolerance=0.05,
        leader_election=LeaderElectionConfig(True, "ha", "autoscaling", 3.0, 2.0, 0.5),
    )


ROWS: list[tuple[str, Any, list[str]]] = [
    ("not a mapping", "yes", ['kubernetes: expected a mapping, got string "yes"']),
    (
        "typo",
        {"driftIntervall": "5m"},
        ['kubernetes.driftIntervall: unknown key; did you mean "driftInterval"?'],
    ),
    (
        "missing kubeconfig",
        {"kubeconfig": "nope"},
        ["kubernetes.kubeconfig: file not found: {dir}/nope"],
    ),
    (
        "negative interval",
        {"driftInterval": "-1m"},
        ['kubernetes.driftInterval: must be >= 0, got "-1m"'],
    ),
    (
        "interval not a duration",
        {"driftInterval": 300},
        [
            'kubernetes.driftInterval: expected a duration with a unit such as "5m" ("300s" '
            "for 300 seconds; only 0 may stand alone), got integer 300"
        ],
    ),
    (
        "tolerance a number",
        {"driftTolerance": 3},
        ['kubernetes.driftTolerance: expected a percentage such as "3%", got integer 3'],
    ),
    (
        "tolerance a fraction",
        {"driftTolerance": 0.03},
        ['kubernetes.driftTolerance: expected a percentage such as "3%", got number 0.03'],
    ),
    (
        "lease duration a bare zero",
        {"leaderElection": {"leaseDuration": 0}},
        [
            f"{LE}.leaseDuration: must be > 0, got 0",
            f"{LE}.leaseDuration: must be greater than renewDeadline (10s)",
        ],
    ),
    (
        "tolerance not a percentage",
        {"driftTolerance": "0.03"},
        [
            'kubernetes.driftTolerance: invalid percentage "0.03": '
            "expected a number followed by %, such as 10%"
        ],
    ),
    (
        "tolerance too big",
        {"driftTolerance": "100%"},
        ['kubernetes.driftTolerance: must be from 0% to 99%, got "100%"'],
    ),
    (
        "enabled not a boolean",
        {"leaderElection": {"enabled": "yes"}},
        [f'{LE}.enabled: expected true or false, got string "yes"'],
    ),
    (
        "lease name",
        {"leaderElection": {"leaseName": "Not_A_Name"}},
        [
            f'{LE}.leaseName: invalid name "Not_A_Name": expected a DNS-1123 label (lowercase '
            "letters, digits and '-', starting and ending with a letter or digit)"
        ],
    ),
    (
        "lease not longer than the renew deadline",
        {"leaderElection": {"leaseDuration": "10s"}},
        [f"{LE}.leaseDuration: must be greater than renewDeadline (10s)"],
    ),
    (
        "renew deadline within the retry jitter",
        {"leaderElection": {"renewDeadline": "2s"}},
        [f"{LE}.renewDeadline: must be greater than 1.2 x retryPeriod (2.4s)"],
    ),
    (
        "zero retry",
        {"leaderElection": {"retryPeriod": "0s"}},
        [f'{LE}.retryPeriod: must be > 0, got "0s"'],
    ),
]


@pytest.mark.parametrize(("section", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_errors_name_the_key(tmp_path: Path, section: Any, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, section), env=ENV)
    assert caught.value.errors == [e.replace("{dir}", str(tmp_path)) for e in expected]
