"""tools/release.py, run as a release runs it: wheels for x86_64 and aarch64 (maturin with zig),
the sdist, the image archive (of the image tests/fixtures/image.py built: the same Dockerfile),
the packaged chart, SBOMs of the image and of each wheel, and SHA256SUMS; the image and the
chart pushed to a loopback registry (fixtures/registry.py) and signed with cosign and a key
the test makes, the image's SBOM attested. The x86_64 wheel is then installed into a fresh
virtualenv with no Rust toolchain anywhere on PATH and runs `demo --once`, as a Python user
would; a user's `cosign verify` accepts what was published and refuses what was not signed,
was changed, or was signed with another key."""

from __future__ import annotations

import base64
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
from fixtures.image import NEEDS_IMAGE, PODMAN_GLOBAL, podman, podman_binary
from fixtures.registry import Registry
from fixtures.tools import COSIGN, HELM, SYFT, install

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


KEY_PASSWORD = "release-test"


def release_env(helm: str) -> dict[str, str]:
    env = dict(os.environ)
    env["CONTAINER_ENGINE"] = shlex.join([podman_binary(), *PODMAN_GLOBAL])
    env["HELM"] = helm
    env["SYFT"] = install(SYFT)
    env["COSIGN"] = install(COSIGN)
    env["COSIGN_PASSWORD"] = KEY_PASSWORD
    return env


def cosign(*args: str, key_password: str = KEY_PASSWORD) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COSIGN_PASSWORD": key_password}
    return subprocess.run([install(COSIGN), *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cosign key pair (cosign.key, cosign.pub) made for this release."""
    directory = tmp_path_factory.mktemp("keys")
    done = cosign("generate-key-pair", "--output-key-prefix", str(directory / "cosign"))
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture(scope="module")
def release(
    image: str, registry: Registry, keys: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("release") / f"release-{VERSION}"
    argv = [sys.executable, str(ROOT / "tools/release.py"), "--out", str(out)]
    argv += ["--registry", registry.host, "--plain-http", "--cosign-key", str(keys / "cosign.key")]
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


def published(release: Path) -> dict[str, str]:
    """PUBLISHED: what the release pushed, by digest."""
    return dict(line.split(" ", 1) for line in (release / "PUBLISHED").read_text().splitlines())


def wheels(release: Path) -> dict[str, Path]:
    found = {}
    for path in release.glob("*.whl"):
        match = WHEEL.fullmatch(path.name)
        assert match, f"{path.name}: not an abi3 manylinux2014 wheel of {VERSION}"
        found[match["arch"]] = path
    return found


pytestmark = [pytest.mark.image, pytest.mark.release, NEEDS_IMAGE]


def test_every_artifact_is_there_with_its_checksum(release: Path) -> None:
    names = {p.name for p in release.iterdir()} - {"SHA256SUMS", "SHA256SUMS.sigstore.json"}
    assert set(wheels(release)) == {"x86_64", "aarch64"}
    assert f"cloudscale_autoscaler-{VERSION}.tar.gz" in names  # the sdist
    assert f"cloudscale-autoscaler-{VERSION}-image.tar.gz" in names
    assert f"cloudscale-autoscaler-{CHART_VERSION}.tgz" in names  # the chart
    sboms = {f"{p.name}.spdx.json" for p in wheels(release).values()}
    assert sboms | {f"cloudscale-autoscaler-{VERSION}-image.spdx.json", "PUBLISHED"} <= names
    assert len(names) == 9, sorted(names)
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
    for name in ("release.py", "publish.py"):
        (tree / "tools" / name).write_text((ROOT / "tools" / name).read_text())
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


# --- SBOMs and signatures, as a user checks them (docs/releasing.md) ------------------------


def spdx_packages(path: Path) -> dict[str, set[str]]:
    """An SPDX JSON document's packages: name -> versions."""
    document = json.loads(path.read_text())
    assert document["spdxVersion"] == "SPDX-2.3", document.get("spdxVersion")
    found: dict[str, set[str]] = {}
    for package in document["packages"]:
        found.setdefault(package["name"], set()).add(package.get("versionInfo", ""))
    return found


def test_the_sboms_list_what_the_image_and_the_wheels_hold(release: Path) -> None:
    """The image's: Debian's Python and the project with its dependencies at the versions
    installed; each wheel's: the project and the crates of its compiled transport."""
    image = spdx_packages(release / f"cloudscale-autoscaler-{VERSION}-image.spdx.json")
    assert VERSION in image["cloudscale-autoscaler"], sorted(image)
    for dependency in ("kubernetes", "grpcio", "cryptography", "protobuf"):
        assert dependency in image, sorted(image)
    assert any(name.startswith("python3.11") or name == "python" for name in image), sorted(image)
    lock = tomllib.loads((ROOT / "rust" / "Cargo.lock").read_text())
    crates = {p["name"]: p["version"] for p in lock["package"]}
    for wheel in wheels(release).values():
        held = spdx_packages(wheel.with_name(wheel.name + ".spdx.json"))
        assert VERSION in held["cloudscale-autoscaler"] or VERSION in held.get(
            "cloudscale_autoscaler", set()
        ), sorted(held)
        for crate in ("tonic", "rustls", "pyo3"):
            assert crates[crate] in held[crate], (crate, held.get(crate))


def test_a_user_verifies_the_image_the_chart_and_the_sbom_attestation(
    release: Path, keys: Path
) -> None:
    public = str(keys / "cosign.pub")
    offline = ("--insecure-ignore-tlog=true", "--allow-http-registry")
    refs = published(release)
    for what in ("image", "chart"):
        done = cosign("verify", "--key", public, *offline, refs[what])
        assert done.returncode == 0, (what, done.stderr)
        claims = json.loads(done.stdout)
        digests = {claim["critical"]["image"]["docker-manifest-digest"] for claim in claims}
        assert digests == {refs[what].split("@")[1]}, claims
    done = cosign("verify-attestation", "--key", public, "--type", "spdxjson", *offline,
                  refs["image"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    statement = json.loads(base64.b64decode(json.loads(done.stdout.splitlines()[0])["payload"]))
    assert statement["predicateType"] == "https://spdx.dev/Document"
    names = {p["name"] for p in statement["predicate"]["packages"]}
    assert "cloudscale-autoscaler" in names
    sums = release / "SHA256SUMS"
    print(f"verified: {refs}")
    done = cosign("verify-blob", "--key", public, "--insecure-ignore-tlog=true", "--bundle",
                  str(release / "SHA256SUMS.sigstore.json"), str(sums))  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_an_unsigned_changed_or_foreign_artifact_is_refused(
    release: Path, keys: Path, registry: Registry, tmp_path: Path
) -> None:
    """What a user's verification must refuse: an image pushed over the release's tag (its
    digest has no signature), an image nobody signed, the release verified with another key,
    and a changed SHA256SUMS."""
    public = str(keys / "cosign.pub")
    offline = ("--insecure-ignore-tlog=true", "--allow-http-registry")
    (tmp_path / "payload").write_text("not the release\n")
    with tarfile.open(tmp_path / "rootfs.tar", "w") as tar:
        tar.add(tmp_path / "payload", "payload")
    podman("import", str(tmp_path / "rootfs.tar"), "localhost/not-the-release:1")
    tag = f"{registry.reference('cloudscale-autoscaler')}:{VERSION}"
    registry.push_image("localhost/not-the-release:1", "cloudscale-autoscaler", VERSION)
    unsigned = registry.push_image("localhost/not-the-release:1", "unsigned", "1")
    other = tmp_path / "other"
    assert cosign("generate-key-pair", "--output-key-prefix", str(other)).returncode == 0
    refs = published(release)
    tampered = tmp_path / "SHA256SUMS"
    tampered.write_text((release / "SHA256SUMS").read_text().replace("a", "b", 1))
    attempts = {
        "an image pushed over the tag": ("verify", "--key", public, *offline, tag),
        "an unsigned image": (
            "verify", "--key", public, *offline, f"{registry.reference('unsigned')}@{unsigned}"
        ),
        "an unattested image": (
            "verify-attestation", "--key", public, "--type", "spdxjson", *offline, tag
        ),
        "the image with another key": ("verify", "--key", f"{other}.pub", *offline,
                                       refs["image"]),
        "the chart with another key": ("verify", "--key", f"{other}.pub", *offline,
                                       refs["chart"]),
        "a changed SHA256SUMS": (
            "verify-blob", "--key", public, "--insecure-ignore-tlog=true", "--bundle",
            str(release / "SHA256SUMS.sigstore.json"), str(tampered),
        ),
    }  # fmt: skip
    answers = {what: cosign(*argv) for what, argv in attempts.items()}
    for what, answer in answers.items():
        print(f"{what}: exit {answer.returncode}: {answer.stderr.strip().splitlines()[-1:]}")
    # cosign exits 10 when it finds no signature at all, 1 when none verifies.
    refused = {what: a.returncode in (1, 10) for what, a in answers.items()}
    assert refused == dict.fromkeys(attempts, True), {w: a.returncode for w, a in answers.items()}
