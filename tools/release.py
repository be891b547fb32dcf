"""Build a release into one directory: what a release publishes, with its checksums.

Usage: python tools/release.py [--out DIR] [--arch ARCH ...] [--image-from REF | --no-image]
                               [--python-image REF] [--ca-certificates FILE]

Into DIR (default dist/release-<version>):
- the wheels: `abi3` (one wheel serves CPython 3.11 and later), manylinux2014 (glibc 2.17 or
  newer), for x86_64 and aarch64. maturin builds them with zig as the C compiler and linker, so
  one machine makes both and the wheels do not depend on the build machine's glibc;
- the source distribution;
- the image as an archive (`docker load` / `podman load` reads it), tagged with the chart's
  image repository and the version;
- the packaged chart;
- SHA256SUMS (`sha256sum -c SHA256SUMS` checks them).

Needs: a Rust toolchain by rustup with the targets (`rustup target add
aarch64-unknown-linux-gnu`), `pip install --group release` (maturin, and zig from PyPI's
`ziglang`), helm, and podman or docker (CONTAINER_ENGINE, e.g. "docker" or "podman --runtime
runc"). The version is pyproject.toml's; the chart's appVersion must be the same, else the
release stops before building anything.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def run(argv: Sequence[str], env: dict[str, str] | None = None) -> None:
    """Run a step in the repository, its output shown; a failure stops the release, naming
    the command."""
    print(f"+ {shlex.join(argv)}", flush=True)
    done = subprocess.run(argv, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"`{shlex.join(argv)}` exited {done.returncode}")


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


def save_image(reference: str, archive: Path) -> None:
    """The image as a gzip'd docker-archive, which docker and podman both load."""
    with tempfile.TemporaryDirectory(dir=archive.parent) as scratch:
        plain = Path(scratch) / "image.tar"
        engine = container_engine()
        run([*engine, "save", "--format", "docker-archive", "--output", str(plain), reference])
        with plain.open("rb") as source, gzip.open(archive, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)


def package_chart(out: Path) -> None:
    helm = os.environ.get("HELM", "helm")
    if shutil.which(helm) is None:
        raise ReleaseError(f"helm not found ({helm!r}): put it on PATH or set HELM")
    run([helm, "package", str(CHART), "--destination", str(out)])


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
    return parser.parse_args(argv)


def release(args: argparse.Namespace) -> Path:
    version = project_version()
    check_chart(version)
    out: Path = args.out or ROOT / "dist" / f"release-{version}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for arch in args.arch or sorted(ARCHES):
        timed(f"wheel {arch}", build_wheel, arch, out)
    timed("sdist", build_sdist, out)
    if not args.no_image:
        reference = f"{image_repository()}:{version}"
        if args.image_from:
            run([*container_engine(), "tag", args.image_from, reference])
        else:
            timed("image", build_image, reference, args.python_image, args.ca_certificates)
        archive = out / f"cloudscale-autoscaler-{version}-image.tar.gz"
        timed("image archive", save_image, reference, archive)
    timed("chart", package_chart, out)
    write_checksums(out)
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
