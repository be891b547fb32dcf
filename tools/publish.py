"""What tools/release.py runs to publish a release: the commands (as argv lists) that push the
image and the chart to an OCI registry, describe the image and the wheels in SBOMs, and sign
the image, the chart, the image's SBOM attestation and the checksums with cosign; and how their
output names what they pushed.

Signing uses a key (`cosign generate-key-pair`; its password in COSIGN_PASSWORD), not
Sigstore's keyless signing, which needs the public Fulcio and Rekor services: no transparency
log entry is made (`--tlog-upload=false`), so verifying takes `--insecure-ignore-tlog=true`
(docs/releasing.md). SBOMs are SPDX 2.3 JSON from syft.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
IMAGE_REPOSITORY = "cloudscale-autoscaler"
CHART_REPOSITORY = "charts"
# The predicate type cosign attests an SPDX JSON document as (`--type spdxjson`).
SBOM_TYPE = "spdxjson"
SBOM_FORMAT = "spdx-json"


@dataclass(frozen=True)
class Registry:
    """Where a release is published: `host[:port][/path]`, and whether it speaks plain HTTP
    (a test's loopback registry; never a real one)."""

    location: str
    plain_http: bool = False

    def image(self, version: str) -> str:
        return f"{self.location}/{IMAGE_REPOSITORY}:{version}"

    def image_repository(self) -> str:
        return f"{self.location}/{IMAGE_REPOSITORY}"

    def charts(self) -> str:
        return f"oci://{self.location}/{CHART_REPOSITORY}"

    def chart_repository(self, name: str) -> str:
        return f"{self.location}/{CHART_REPOSITORY}/{name}"


def push_image(engine: list[str], local: str, registry: Registry, version: str,
               digestfile: Path) -> list[str]:  # fmt: skip
    """podman/docker push of the built image; podman writes the pushed digest to
    `digestfile`."""
    argv = [*engine, "push"]
    if registry.plain_http:
        argv.append("--tls-verify=false")
    return [*argv, "--digestfile", str(digestfile), local, registry.image(version)]


def push_chart(helm: str, archive: Path, registry: Registry) -> list[str]:
    argv = [helm, "push", str(archive), registry.charts()]
    return [*argv, "--plain-http"] if registry.plain_http else argv


def pushed_digest(output: str) -> str:
    """The digest `helm push` printed ("Digest: sha256:...")."""
    found = DIGEST.findall(output)
    if not found:
        raise ValueError(f"no digest in: {output.strip()[-500:]}")
    return str(found[-1])


def sbom(syft: str, source: str, name: str, version: str, out: Path) -> list[str]:
    """syft's SPDX JSON of `source` (`registry:REF`, `docker-archive:TAR`, `dir:PATH`)."""
    return [syft, "scan", source, "--source-name", name, "--source-version", version,
            "--output", f"{SBOM_FORMAT}={out}"]  # fmt: skip


def syft_env(registry: Registry | None) -> dict[str, str]:
    """syft pulls a plain-HTTP registry's image only when told so; it looks for no update."""
    env = {"SYFT_CHECK_FOR_APP_UPDATE": "false"}
    if registry is not None and registry.plain_http:
        env["SYFT_REGISTRY_INSECURE_USE_HTTP"] = "true"
    return env


def _offline(registry: Registry | None) -> list[str]:
    """Key signing without Sigstore's services: no signing config from its TUF repository, no
    transparency log upload."""
    flags = ["--use-signing-config=false", "--tlog-upload=false"]
    return [*flags, "--allow-http-registry"] if registry and registry.plain_http else flags


def sign(cosign: str, key: Path, reference: str, registry: Registry) -> list[str]:
    """A signature of `reference` (by digest), pushed beside it in the registry."""
    return [cosign, "sign", "--yes", "--key", str(key), *_offline(registry), reference]


def attest(cosign: str, key: Path, reference: str, predicate: Path, registry: Registry
           ) -> list[str]:  # fmt: skip
    """A signed in-toto attestation of `reference` whose predicate is the SBOM."""
    return [cosign, "attest", "--yes", "--key", str(key), "--type", SBOM_TYPE,
            "--predicate", str(predicate), *_offline(registry), reference]  # fmt: skip


def sign_blob(cosign: str, key: Path, path: Path, bundle: Path) -> list[str]:
    """A signature of a file (SHA256SUMS), in a Sigstore bundle beside it."""
    return [cosign, "sign-blob", "--yes", "--key", str(key), "--bundle", str(bundle),
            *_offline(None), str(path)]  # fmt: skip
