"""tools/release.py, run as a release runs it: wheels for x86_64 and aarch64 (maturin with zig),
the sdist, the image archive (of the image tests/fixtures/image.py built: the same Dockerfile),
the packaged chart and SHA256SUMS. The x86_64 wheel is then installed into a fresh virtualenv
with no Rust toolchain anywhere on PATH and runs `demo --once`, as a Python user would."""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from fixtures.image import NEEDS_IMAGE, PODMAN_GLOBAL, podman_binary
from fixtures.tools import HELM, install

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# The chart has its own version (it changes when the templates do); its appVersion is VERSION.
CHART_VERSION = yaml.safe_load((ROOT / "deploy/helm/cloudscale-autoscaler/Chart.yaml").read_text())[
    "version"
]
REPOSITORY = yaml.safe_load((ROOT / "deploy/helm/cloudscale-autoscaler/values.yaml").read_text())[
    "image"
]["repository"]
# ELF e_machine of each wheel's architecture.
MACHINES = {"x86_64": 0x3E, "aarch64": 0xB7}
WHEEL = re.compile(
    rf"cloudscale_autoscaler-{re.escape(VERSION)}-cp311-abi3-"
    r"manylinux2014_(?P<arch>\w+?)\.manylinux_2_17_(?P=arch)\.whl"
)


def release_env(helm: str) -> dict[str, str]:
    env = dict(os.environ)
    env["CONTAINER_ENGINE"] = shlex.join([podman_binary(), *PODMAN_GLOBAL])
    env["HELM"] = helm
    return env


@pytest.fixture(scope="module")
def release(image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / f"release-{VERSION}"
    argv = [sys.executable, str(ROOT / "tools/release.py"), "--out", str(out)]
    started = time.monotonic()
    done = subprocess.run(
        [*argv, "--image-from", image],
        env=release_env(install(HELM)),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    print(f"release built in {time.monotonic() - started:.0f} s")
    return out


def wheels(release: Path) -> dict[str, Path]:
    found = {}
    for path in release.glob("*.whl"):
        match = WHEEL.fullmatch(path.name)
        assert match, f"{path.name}: not an abi3 manylinux2014 wheel of {VERSION}"
        found[match["arch"]] = path
    return found


pytestmark = [pytest.mark.image, pytest.mark.release, NEEDS_IMAGE]


def test_every_artifact_is_there_with_its_checksum(release: Path) -> None:
    names = {p.name for p in release.iterdir()} - {"SHA256SUMS"}
    assert set(wheels(release)) == {"x86_64", "aarch64"}
    assert f"cloudscale_autoscaler-{VERSION}.tar.gz" in names  # the sdist
    assert f"cloudscale-autoscaler-{VERSION}-image.tar.gz" in names
    assert f"cloudscale-autoscaler-{CHART_VERSION}.tgz" in names  # the chart
    assert len(names) == 5, sorted(names)
    listed = {}
    for line in (release / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        listed[name] = digest
    assert set(listed) == names
    for name, digest in listed.items():
        assert hashlib.sha256((release / name).read_bytes()).hexdigest() == digest, name


def test_each_wheel_holds_the_transport_compiled_for_its_architecture(release: Path) -> None:
    for arch, path in wheels(release).items():
        with zipfile.ZipFile(path) as wheel:
            modules = [n for n in wheel.namelist() if n.endswith(".so")]
            assert modules == ["cloudscale_autoscaler/_transport.abi3.so"], modules
            header = wheel.read(modules[0])[:20]
            meta = wheel.read(f"cloudscale_autoscaler-{VERSION}.dist-info/WHEEL").decode()
        assert header[:4] == b"\x7fELF"
        assert int.from_bytes(header[18:20], "little") == MACHINES[arch], arch
        tags = email.parser.Parser().parsestr(meta).get_all("Tag")
        assert f"cp311-abi3-manylinux_2_17_{arch}" in tags, tags


def test_the_wheel_installs_and_runs_the_demo_without_rust(release: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # Only the virtualenv on PATH: no cargo, rustc or C compiler can be found, and pip may
    # take nothing but wheels, so nothing is compiled.
    env = {"PATH": str(venv / "bin"), "HOME": os.environ["HOME"], "LANG": "C.UTF-8"}
    for variable in ("PIP_INDEX_URL", "PIP_CERT", "SSL_CERT_FILE", "PIP_FIND_LINKS"):
        if variable in os.environ:
            env[variable] = os.environ[variable]
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--only-binary", ":all:"]
    installed = subprocess.run(
        [*pip, str(wheels(release)["x86_64"])],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    demo = subprocess.run(
        [str(venv / "bin/cloudscale-autoscaler"), "demo", "--once"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "after Refresh: 0 instances left in the cloud" in demo.stdout
    show = "import cloudscale_autoscaler._transport as t; print(t.__file__)"
    where = subprocess.run(
        [str(venv / "bin/python"), "-c", show],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(venv), where


def test_the_image_archive_loads_as_the_published_name(release: Path) -> None:
    with tarfile.open(release / f"cloudscale-autoscaler-{VERSION}-image.tar.gz") as archive:
        member = archive.extractfile("manifest.json")
        assert member is not None
        manifest = json.load(member)
    assert manifest[0]["RepoTags"] == [f"{REPOSITORY}:{VERSION}"]


def test_the_packaged_chart_deploys_the_release_image(release: Path) -> None:
    chart = release / f"cloudscale-autoscaler-{CHART_VERSION}.tgz"
    rendered = subprocess.run(
        [install(HELM), "template", "ca-provider", str(chart), "--set", "config.cluster=prod"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    images = re.findall(r"image: \"?([^\s\"]+)", rendered.stdout)
    assert f"{REPOSITORY}:{VERSION}" in images, images


def test_a_chart_for_another_version_stops_the_release(tmp_path: Path) -> None:
    """The chart's appVersion names the image it deploys: a release whose chart disagrees with
    pyproject.toml's version is refused before anything is built."""
    tree = tmp_path / "repo"
    (tree / "tools").mkdir(parents=True)
    (tree / "tools/release.py").write_text((ROOT / "tools/release.py").read_text())
    (tree / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    chart = tree / "deploy/helm/cloudscale-autoscaler"
    chart.mkdir(parents=True)
    text = (ROOT / "deploy/helm/cloudscale-autoscaler/Chart.yaml").read_text()
    other = text.replace(f'appVersion: "{VERSION}"', 'appVersion: "9.9.9"')
    (chart / "Chart.yaml").write_text(other)
    done = subprocess.run(
        [sys.executable, str(tree / "tools/release.py"), "--no-image"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Chart.yaml: appVersion is '9.9.9', expected the project's version" in done.stderr
    assert not (tree / "dist").exists()
