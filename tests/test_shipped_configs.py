"""Every config we ship passes `check-config --online` against the API emulator with no
warning: the demo's, examples/config.yaml, the chart's default values and the kustomize base
and example overlay. A newcomer's first run must not teach them to ignore warnings.

Each runs through the real CLI, as a user runs it. What only a Pod has is given the way the
Pod gets it: the files the manifests mount (certificates in cert-manager's Secret layout, the
token) at local paths, POD_NAMESPACE as the downward API sets it, and, for the in-cluster
service account, a kubeconfig (check-config only loads it; nothing connects). The API URL
is the emulator's; everything else is the file as shipped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.tools import INSTALL_TIMEOUT_SECONDS, cli, free_port

from cloudscale_autoscaler.commands.demo import write_workspace
from cloudscale_autoscaler.transport.certs import mint_dev_pki

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "cloudscale-autoscaler"
KUSTOMIZE = ROOT / "deploy" / "kustomize"

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: stands-in-for-the-service-account}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""

Doc = dict[str, Any]


def _demo(tmp_path: Path, url: str) -> Path:
    return write_workspace(tmp_path, url, free_port(), token=TOKEN)


def _example(tmp_path: Path, url: str) -> Path:
    """examples/ as its "Try it" header sets it up: certificates in certs/dev, the token in
    CLOUDSCALE_API_TOKEN (the environment of every run here)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    done = subprocess.run(
        cli("certs", "--out", str(tmp_path / "certs" / "dev")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config = tmp_path / "examples" / "config.yaml"
    config.write_text(config.read_text().replace("http://127.0.0.1:8087/v1", url))
    return config


def _chart_config(helm: str) -> Doc:
    done = subprocess.run(
        [helm, "template", "cloudscale-autoscaler", str(CHART), "--namespace", "kube-system"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (text,) = [
        doc["data"]["config.yaml"]
        for doc in yaml.safe_load_all(done.stdout)
        if doc and doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {})
    ]
    config: Doc = yaml.safe_load(text)
    return config


def _in_pod(config: Doc, tmp_path: Path, url: str) -> Path:
    """A manifest's config, with what the Pod mounts recreated under tmp_path."""
    pki = mint_dev_pki()
    contents = {"cert": pki.server.cert_pem(), "key": pki.server.key_pem(),
                "clientCA": pki.ca.cert_pem()}  # fmt: skip
    for key, content in contents.items():
        config["tls"][key] = str(_mounted(tmp_path, config["tls"][key], content))
    token = config["cloudscale"]["tokenFile"]
    config["cloudscale"]["tokenFile"] = str(_mounted(tmp_path, token, f"{TOKEN}\n".encode()))
    config["cloudscale"]["url"] = url
    if "stateDir" in config:
        config["stateDir"] = str(tmp_path / config["stateDir"].lstrip("/"))
    if "kubernetes" in config:
        assert "kubeconfig" not in config["kubernetes"], "shipped for the in-cluster account"
        (tmp_path / "kubeconfig").write_text(KUBECONFIG)
        config["kubernetes"]["kubeconfig"] = str(tmp_path / "kubeconfig")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _mounted(tmp_path: Path, pod_path: str, content: bytes) -> Path:
    local = tmp_path / pod_path.lstrip("/")
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(content)
    local.chmod(0o600)
    return local


def _kustomize(name: str) -> Callable[[Path, str], Path]:
    def make(tmp_path: Path, url: str) -> Path:
        config = yaml.safe_load((KUSTOMIZE / name / "config.yaml").read_text())
        return _in_pod(config, tmp_path, url)

    return make


SHIPPED: dict[str, Callable[[Path, str], Path]] = {
    "demo": _demo,
    "examples/config.yaml": _example,
    "kustomize base": _kustomize("base"),
    "kustomize example overlay": _kustomize("overlays/example"),
}


async def _check_online(config: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(CLOUDSCALE_API_TOKEN=TOKEN, POD_NAMESPACE="kube-system")
    process = await asyncio.create_subprocess_exec(
        *cli("check-config", "--config", str(config), "--online"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _assert_clean(code: int, out: str, err: str, url: str) -> None:
    assert (code, err) == (0, ""), out + err  # no error, no warning, nothing on stderr
    assert f"online check against {url}: OK (" in out


@pytest.mark.parametrize("name", SHIPPED)
async def test_shipped_config_passes_check_config_online_without_a_warning(
    name: str, tmp_path: Path, emulator: RunningEmulator
) -> None:
    config = SHIPPED[name](tmp_path, emulator.url)
    _assert_clean(*await _check_online(config), emulator.url)


@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)  # helm is built once where it is missing
async def test_chart_default_config_passes_check_config_online_without_a_warning(
    helm: str, tmp_path: Path, emulator: RunningEmulator
) -> None:
    config = _in_pod(await asyncio.to_thread(_chart_config, helm), tmp_path, emulator.url)
    _assert_clean(*await _check_online(config), emulator.url)
