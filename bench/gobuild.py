"""Builds the benchmark's Go programs (bench/go): protoc plugins, generated code, binaries.

Nothing generated is committed: protoc-gen-go and protoc-gen-go-grpc are installed with
`go install` into bench/out/gotools, the Go code for proto/ is generated with grpc_tools.protoc
(the project's pinned protoc) into bench/go/internal/pb, and the binaries go to bench/out/bin.
Go's build cache makes a rebuild take a second or two.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
GO_DIR = ROOT / "bench" / "go"
PROTO_DIR = ROOT / "proto"
MODULE = "cloudscale-autoscaler/bench"
PB_PACKAGE = f"{MODULE}/internal/pb"
# The protoc plugins, pinned: protoc-gen-go at the protobuf-go version of bench/go/go.mod.
PROTOBUF_GO_VERSION = "v1.36.12-0.20260120151049-f2248ac996af"
PROTOC_GEN_GO = f"google.golang.org/protobuf/cmd/protoc-gen-go@{PROTOBUF_GO_VERSION}"
PROTOC_GEN_GO_GRPC = "google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0"
# Our proto files carry no go_package option; these give each one a Go import path.
GO_PACKAGES = {
    "externalgrpc.proto": f"{PB_PACKAGE};pb",
    "k8s/api/core_v1.proto": f"{PB_PACKAGE}/k8s/corev1;corev1",
    "k8s/apimachinery/meta_v1.proto": f"{PB_PACKAGE}/k8s/metav1;metav1",
    "k8s/apimachinery/resource.proto": f"{PB_PACKAGE}/k8s/resource;resource",
}
BUILD_TIMEOUT = 900.0


class GoBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class GoBinaries:
    goref: Path
    client: Path


def go_executable() -> str:
    go = shutil.which("go")
    if go is None:
        raise GoBuildError("go is not installed: the benchmark's client and reference are Go")
    return go


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        raise GoBuildError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr}")


def install_plugins(go: str, tools: Path) -> tuple[Path, Path]:
    """protoc-gen-go and protoc-gen-go-grpc in `tools` (installed once, then reused)."""
    tools.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(tools.resolve())}
    paths = []
    for package in (PROTOC_GEN_GO, PROTOC_GEN_GO_GRPC):
        name = package.split("@")[0].rsplit("/", 1)[-1]
        binary = tools / name
        stamp = tools / f"{name}.version"
        if not binary.exists() or not stamp.exists() or stamp.read_text() != package:
            _run([go, "install", package], GO_DIR, env)
            stamp.write_text(package)
        paths.append(binary)
    return paths[0], paths[1]


def generate(gen_go: Path, gen_grpc: Path) -> None:
    """Go code for proto/ into bench/go/internal/pb (replacing what was there)."""
    out = GO_DIR / "internal" / "pb"
    if out.exists():
        shutil.rmtree(out)
    mappings = [f"M{name}={package}" for name, package in GO_PACKAGES.items()]
    include = str(resources.files("grpc_tools") / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--plugin=protoc-gen-go={gen_go}",
        f"--plugin=protoc-gen-go-grpc={gen_grpc}",
        f"--go_out={GO_DIR}",
        f"--go_opt=module={MODULE}",
        *(f"--go_opt={m}" for m in mappings),
        f"--go-grpc_out={GO_DIR}",
        f"--go-grpc_opt=module={MODULE}",
        *(f"--go-grpc_opt={m}" for m in mappings),
        *GO_PACKAGES,
    ]
    if protoc.main(args) != 0:
        raise GoBuildError(f"protoc failed generating Go code: {' '.join(args)}")


def build(out: Path) -> GoBinaries:
    """Everything from scratch or from Go's caches; returns the two binaries."""
    go = go_executable()
    gen_go, gen_grpc = install_plugins(go, out / "gotools")
    generate(gen_go, gen_grpc)
    bin_dir = out / "bin"
    binaries = GoBinaries(goref=bin_dir / "goref", client=bin_dir / "benchclient")
    for binary in (binaries.goref, binaries.client):
        _run([go, "build", "-o", str(binary), f"./cmd/{binary.name}"], GO_DIR)
    return binaries


if __name__ == "__main__":
    print(build(ROOT / "bench" / "out"), file=sys.stderr)
