"""Build a release into one directory: what a release publishes, with its checksums.

Usage: python tools/release.py [--out DIR] [--arch ARCH ...] [--image-from REF | --no-image]
                               [--python-image REF] [--ca-certificates FILE]
                               [--registry HOST[/PATH] [--plain-http] [--cosign-key FILE]]

Into DIR (default dist/release-<version>):
- the wheels: `abi3` (one wheel serves CPython 3.11 and later), manylinux2014 (glibc 2.17 or
  newer), for x86_64 and aarch64. maturin builds them with zig as the C compiler and linker, so
  one machine makes both and the wheels do not depend on the build machine's glibc;
- the source distribution;
- the image as an archive (`docker load` / `podman load` reads it), tagged with the chart's
  image repository and the version;
- the packaged chart;
- an SBOM (SPDX 2.3 JSON, by syft) of the image and of each wheel (`<file>.spdx.json`; a
  wheel's lists the Rust crates compiled into its transport, from rust/Cargo.lock);
- with `--registry`: the image and the chart pushed there (PUBLISHED names them by digest);
- with `--cosign-key` (and --registry): cosign signatures of the image and the chart, a signed
  SBOM attestation of the image, and SHA256SUMS.sigstore.json, a signature of SHA256SUMS;
- SHA256SUMS (`sha256sum -c SHA256SUMS` checks them).

Needs: a Rust toolchain by rustup with the targets (`rustup target add
aarch64-unknown-linux-gnu`), `pip install --group release` (maturin, and zig from PyPI's
`ziglang`), helm, syft, cosign (for signing), and podman or docker (CONTAINER_ENGINE, e.g.
"docker" or "podman --runtime runc"); HELM, SYFT and COSIGN name them when not on PATH. The
version is pyproject.toml's; the chart's appVersion must be the same, else the release stops
before building anything. docs/releasing.md says how a user verifies a release.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import publish
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "cloudscale-autoscaler"
ARCHES = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}
# The oldest glibc the wheels need: what pip on any maintained Linux distribution accepts.
MANYLINUX = "manylinux2014"


class ReleaseError(Exception):
    """A release step failed; the message says which and why."""


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


def image_repository() -> str:
    """The chart's default image repository: the release's image is published under it."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    repository: str = values["image"]["repository"]
    return repository


def check_chart(version: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    if str(chart.get("appVersion")) != version:
        raise ReleaseError(
            f"{CHART / 'Chart.yaml'}: appVersion is {chart.get('appVersion')!r}, expected the "
            f"project's version {version!r} (pyproject.toml): the chart would deploy another image"
        )


def run(argv: Sequence[str], env: dict[str, str] | None = None, *, capture: bool = False) -> str:
    """Run a step in the repository, its output shown (and returned when `capture`); a failure
    stops the release, naming the command."""
    print(f"+ {shlex.join(argv)}", flush=True)
    done = subprocess.run(argv, env=env, cwd=ROOT, check=False, capture_output=capture,
                          text=True)  # fmt: skip
    output = (done.stdout or "") + (done.stderr or "")
    if capture:
        print(output, end="", flush=True)
    if done.returncode != 0:
        raise ReleaseError(f"`{shlex.join(argv)}` exited {done.returncode}")
    return output


def tool(name: str) -> str:
    """A tool from its environment variable (HELM, SYFT, COSIGN), else PATH."""
    found = os.environ.get(name.upper(), name)
    if shutil.which(found) is None:
        raise ReleaseError(f"{name} not found ({found!r}): put it on PATH or set {name.upper()}")
    return found


def build_env() -> dict[str, str]:
    """maturin finds zig as `python -m ziglang` with the first python on PATH: this one's."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env


def build_wheel(arch: str, out: Path) -> None:
    maturin = [sys.executable, "-m", "maturin", "build", "--release", "--strip", "--zig"]
    maturin += ["--target", ARCHES[arch], "--compatibility", MANYLINUX, "--out", str(out)]
    run(maturin, build_env())


def build_sdist(out: Path) -> None:
    manifest = str(ROOT / "rust" / "Cargo.toml")
    run([sys.executable, "-m", "maturin", "sdist", "--manifest-path", manifest, "--out", str(out)])


def container_engine() -> list[str]:
    engine = shlex.split(os.environ.get("CONTAINER_ENGINE", "podman"))
    if not engine or shutil.which(engine[0]) is None:
        raise ReleaseError(f"container engine {engine[:1]} not found: set CONTAINER_ENGINE")
    return engine


def build_image(reference: str, python_image: str | None, ca_certificates: Path | None) -> None:
    argv = [*container_engine(), "build", "--tag", reference]
    if python_image:
        argv += ["--build-arg", f"PYTHON_IMAGE={python_image}"]
    if ca_certificates:
        argv += ["--secret", f"id=ca-certificates,src={ca_certificates}"]
    run([*argv, str(ROOT)])


def save_image(reference: str, archive: Path, sbom: Path, version: str) -> None:
    """The image as a gzip'd docker-archive, which docker and podman both load, and its SBOM
    (read from the archive: what the image holds, whichever registry it is pushed to)."""
    with tempfile.TemporaryDirectory(dir=archive.parent) as scratch:
        plain = Path(scratch) / "image.tar"
        engine = container_engine()
        run([*engine, "save", "--format", "docker-archive", "--output", str(plain), reference])
        syft = publish.sbom(tool("syft"), f"docker-archive:{plain}", "cloudscale-autoscaler",
                            version, sbom)  # fmt: skip
        run(syft, {**os.environ, **publish.syft_env(None)})
        with plain.open("rb") as source, gzip.open(archive, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)


def wheel_sbom(wheel: Path, version: str) -> None:
    """The wheel's SBOM: its own package (the unpacked wheel's metadata) and the crates its
    compiled transport is built from (rust/Cargo.lock)."""
    with tempfile.TemporaryDirectory() as scratch:
        with zipfile.ZipFile(wheel) as unpacked:
            unpacked.extractall(scratch)
        shutil.copy2(ROOT / "rust" / "Cargo.lock", scratch)
        out = wheel.with_name(wheel.name + ".spdx.json")
        syft = publish.sbom(tool("syft"), f"dir:{scratch}", wheel.name, version, out)
        run(syft, {**os.environ, **publish.syft_env(None)})


def package_chart(out: Path) -> Path:
    run([tool("helm"), "package", str(CHART), "--destination", str(out)])
    (archive,) = out.glob("cloudscale-autoscaler-*.tgz")
    return archive


def publish_release(registry: publish.Registry, image: str | None, chart: Path, version: str,
                    out: Path) -> dict[str, str]:  # fmt: skip
    """Push the image and the chart; each one's reference by digest."""
    published = {}
    if image is not None:
        digestfile = out.parent / f".{out.name}.digest"
        try:
            argv = publish.push_image(container_engine(), image, registry, version, digestfile)
            output = run(argv, capture=True)
            digest = digestfile.read_text().strip() if digestfile.exists() else None
        finally:
            digestfile.unlink(missing_ok=True)
        digest = digest or publish.pushed_digest(output)  # docker prints it
        published["image"] = f"{registry.image_repository()}@{digest}"
    output = run(publish.push_chart(tool("helm"), chart, registry), capture=True)
    name = chart.name.rsplit("-", 1)[0]
    published["chart"] = f"{registry.chart_repository(name)}@{publish.pushed_digest(output)}"
    return published


def sign_release(key: Path, registry: publish.Registry, published: dict[str, str],
                 image_sbom: Path | None) -> None:  # fmt: skip
    """Signatures of what was pushed and the image's SBOM attestation, beside them in the
    registry (COSIGN_PASSWORD holds the key's password)."""
    cosign = tool("cosign")
    for reference in published.values():
        run(publish.sign(cosign, key, reference, registry))
    if image_sbom is not None and "image" in published:
        run(publish.attest(cosign, key, published["image"], image_sbom, registry))


def write_checksums(out: Path) -> Path:
    """SHA256SUMS over every other file, in `sha256sum`'s own format."""
    sums = out / "SHA256SUMS"
    lines = []
    for path in sorted(p for p in out.iterdir() if p.is_file() and p != sums):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    sums.write_text("".join(lines))
    return sums


def timed(what: str, step: Callable[..., None], *args: Any) -> None:
    started = time.monotonic()
    step(*args)
    print(f"== {what}: {time.monotonic() - started:.1f} s", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the release directory (emptied first)")
    parser.add_argument("--arch", action="append", choices=sorted(ARCHES),
                        help="a wheel architecture (repeatable; default: all)")  # fmt: skip
    image = parser.add_mutually_exclusive_group()
    image.add_argument("--image-from", metavar="REF", help="save this built image, not a build")
    image.add_argument("--no-image", action="store_true", help="leave the image out")
    parser.add_argument("--python-image", metavar="REF", help="the Dockerfile's PYTHON_IMAGE")
    parser.add_argument("--ca-certificates", type=Path, metavar="FILE",
                        help="a trust store for the image build")  # fmt: skip
    parser.add_argument("--registry", metavar="HOST[/PATH]",
                        help="push the image and the chart to this OCI registry")  # fmt: skip
    parser.add_argument("--plain-http", action="store_true",
                        help="the registry speaks plain HTTP (a test's, on loopback)")  # fmt: skip
    parser.add_argument("--cosign-key", type=Path, metavar="FILE",
                        help="sign with this cosign key (password: COSIGN_PASSWORD)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.cosign_key and not args.registry:
        parser.error("--cosign-key signs what is pushed: it needs --registry")
    return args


def release(args: argparse.Namespace) -> Path:
    version = project_version()
    check_chart(version)
    out: Path = args.out or ROOT / "dist" / f"release-{version}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for arch in args.arch or sorted(ARCHES):
        timed(f"wheel {arch}", build_wheel, arch, out)
    for wheel in sorted(out.glob("*.whl")):
        timed(f"SBOM {wheel.name}", wheel_sbom, wheel, version)
    timed("sdist", build_sdist, out)
    reference, image_sbom = None, None
    if not args.no_image:
        reference = f"{image_repository()}:{version}"
        if args.image_from:
            run([*container_engine(), "tag", args.image_from, reference])
        else:
            timed("image", build_image, reference, args.python_image, args.ca_certificates)
        archive = out / f"cloudscale-autoscaler-{version}-image.tar.gz"
        image_sbom = out / f"cloudscale-autoscaler-{version}-image.spdx.json"
        timed("image archive and SBOM", save_image, reference, archive, image_sbom, version)
    chart = package_chart(out)
    if args.registry:
        registry = publish.Registry(args.registry, args.plain_http)
        published = publish_release(registry, reference, chart, version, out)
        (out / "PUBLISHED").write_text("".join(f"{k} {v}\n" for k, v in published.items()))
        if args.cosign_key:
            timed("signatures", sign_release, args.cosign_key, registry, published, image_sbom)
    sums = write_checksums(out)
    if args.cosign_key:
        bundle = out / "SHA256SUMS.sigstore.json"
        run(publish.sign_blob(tool("cosign"), args.cosign_key, sums, bundle))
    for path in sorted(out.iterdir()):
        print(f"{path.stat().st_size / 1e6:9.1f} MB  {path.name}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        out = release(parse_args(argv))
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print(f"release in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
