"""`check-config --offline`: the configs meant for a Pod (kustomize base and overlay, the
chart's rendered config) lint anywhere, as a real process, without the TLS, token and
kubeconfig files only the Pod has; each check left out is listed; the file's own mistakes
(a misspelt key, a bad duration) still fail it. Rendered manifests on standard input
(`helm template ... | check-config --offline --config -`) are read for the provider's
ConfigMap."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from fixtures.tools import INSTALL_TIMEOUT_SECONDS, cli, run_cli

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "deploy" / "kustomize" / "base"
OVERLAY = ROOT / "deploy" / "kustomize" / "overlays" / "example"
CHART = ROOT / "deploy" / "helm" / "cloudscale-autoscaler"
POD_CONFIGS = [BASE / "config.yaml", OVERLAY / "config.yaml"]
NEEDS_TOOL = pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)


def check_stdin(text: str) -> subprocess.CompletedProcess[str]:
    argv = cli("check-config", "--offline", "--config", "-")
    return subprocess.run(argv, input=text, capture_output=True, text=True, timeout=60)


def skipped_lines(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.split("skipped (", 1)[1].splitlines()[1:]]


@pytest.mark.parametrize("path", POD_CONFIGS, ids=lambda p: p.parent.name)
def test_a_pod_config_fails_here_and_passes_offline(path: Path) -> None:
    plain = run_cli("check-config", "--config", str(path))
    assert plain.returncode == 2
    assert "tls.cert: file not found: /etc/cloudscale-autoscaler/tls/tls.crt" in plain.stderr
    offline = run_cli("check-config", "--offline", "--config", str(path))
    assert offline.returncode == 0, offline.stderr
    assert f"{path}: config OK (offline)" in offline.stdout
    skipped = skipped_lines(offline.stdout)
    assert "tls.cert: /etc/cloudscale-autoscaler/tls/tls.crt not read (offline)" in skipped
    assert "cloudscale.tokenFile: /etc/cloudscale-autoscaler/token/token not read (offline)" in (
        skipped
    )
    assert any(line.startswith("kubernetes: credentials") for line in skipped)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda g: g.update(maxsize=3),
            'nodeGroups[0].maxsize: unknown key; did you mean "maxSize"?',
        ),
        (
            lambda g: g.update(autoscalingOptions={"scaleDownUnneededTime": "ten minutes"}),
            'scaleDownUnneededTime: invalid duration "ten minutes"',
        ),
        (lambda g: g.update(minSize=9), "nodeGroups[0].maxSize: must be >= minSize (9)"),
    ],
    ids=["misspelt key", "bad duration", "sizes"],
)
def test_offline_still_refuses_the_file_s_own_mistakes(
    tmp_path: Path, change: object, expected: str
) -> None:
    doc = yaml.safe_load((BASE / "config.yaml").read_text())
    change(doc["nodeGroups"][0])  # type: ignore[operator]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = run_cli("check-config", "--offline", "--config", str(path))
    assert done.returncode == 2
    assert expected in done.stderr, done.stderr


def test_offline_reads_no_file_and_resolves_no_host(tmp_path: Path) -> None:
    """Names the Pod's network resolves (a Service's host name) are left to the Pod; a
    stateDir on a volume only the Pod mounts is not tried; the token may come from the Pod's
    environment."""
    doc = yaml.safe_load((BASE / "config.yaml").read_text())
    doc["metrics"] = {"listen": "metrics.invalid:8080"}
    doc["stateDir"] = "/no/such/volume/state"
    doc["kubernetes"]["kubeconfig"] = "/etc/kube/config"
    del doc["cloudscale"]["tokenFile"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = run_cli("check-config", "--offline", "--config", str(path))
    assert done.returncode == 0, done.stderr
    skipped = skipped_lines(done.stdout)
    assert 'metrics.listen: host name "metrics.invalid" not resolved (offline)' in skipped
    assert "stateDir: not checked that /no/such/volume/state is writable (offline)" in skipped
    assert "kubernetes.kubeconfig: /etc/kube/config not read (offline)" in skipped
    assert any("CLOUDSCALE_API_TOKEN" in line for line in skipped)
    online = run_cli("check-config", "--config", str(path))
    assert online.returncode == 2 and "metrics.invalid" in online.stderr


def _manifests(*objects: dict[str, object]) -> str:
    return yaml.safe_dump_all(objects)


def _config_map(name: str, config: str) -> dict[str, object]:
    meta = {"name": name, "namespace": "kube-system"}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"config.yaml": config},
    }


def test_manifests_on_stdin_are_searched_for_the_provider_s_config_map() -> None:
    config = (BASE / "config.yaml").read_text()
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    done = check_stdin(_manifests(service, _config_map("provider-config", config)))
    assert done.returncode == 0, done.stderr
    assert (
        "standard input (ConfigMap kube-system/provider-config): config OK (offline)" in done.stdout
    )
    bad = check_stdin(_manifests(_config_map("c", config.replace("maxSize", "maxSise"))))
    assert bad.returncode == 2 and 'did you mean "maxSize"' in bad.stderr
    none = check_stdin(_manifests(service))
    assert none.returncode == 2
    assert "expected exactly one ConfigMap with a config.yaml key" in none.stderr
    two = check_stdin(_manifests(_config_map("a", config), _config_map("b", config)))
    assert two.returncode == 2 and "found 2 (ConfigMap kube-system/a, ConfigMap kube-system/b)" in (
        two.stderr
    )


def test_standard_input_is_read_only_offline() -> None:
    argv = cli("check-config", "--config", "-")
    done = subprocess.run(argv, input="cluster: c\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "only with --offline" in done.stderr


def test_online_and_offline_exclude_each_other() -> None:
    done = run_cli("check-config", "--offline", "--online", "--config", "x.yaml")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


@NEEDS_TOOL
@pytest.mark.parametrize("values", [[], ["--set", "replicas=2"]], ids=["defaults", "two replicas"])
def test_the_chart_s_rendered_config_lints_offline(helm: str, values: list[str]) -> None:
    rendered = subprocess.run(
        [helm, "template", "cloudscale-autoscaler", str(CHART), "-n", "kube-system", *values],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    done = check_stdin(rendered)
    assert done.returncode == 0, done.stderr
    assert "(ConfigMap kube-system/cloudscale-autoscaler-config): config OK (offline)" in (
        done.stdout
    )
    misspelt = check_stdin(rendered.replace("maxSize:", "maxSise:", 1))
    assert misspelt.returncode == 2 and "maxSise: unknown key" in misspelt.stderr


@NEEDS_TOOL
@pytest.mark.parametrize("directory", [BASE, OVERLAY], ids=["base", "overlay"])
def test_a_kustomize_build_lints_offline(kustomize: list[str], directory: Path) -> None:
    built = subprocess.run(
        [*kustomize, str(directory)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    done = check_stdin(built)
    assert done.returncode == 0, done.stderr
    assert "(ConfigMap kube-system/cloudscale-autoscaler-config-" in done.stdout
