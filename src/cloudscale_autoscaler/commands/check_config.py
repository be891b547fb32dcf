"""`cloudscale-autoscaler check-config [--online | --offline]`: validate, summarise,
optionally ask the API, or lint without the Pod's files.

Exit codes: 0 = valid (and, with --online, every flavor, image and zone exists), 2 = any error,
including an unreachable API or a rejected token.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from cloudscale_autoscaler.cloud.errors import AuthenticationError, CloudError
from cloudscale_autoscaler.cloud.models import Network, Subnet
from cloudscale_autoscaler.config.advice import config_warnings
from cloudscale_autoscaler.config.interfaces import interfaces_text
from cloudscale_autoscaler.config.kubernetes import kubernetes_text, outside_pod_error
from cloudscale_autoscaler.config.loader import TOKEN_ENV, load_config, load_offline
from cloudscale_autoscaler.config.manifests import ManifestProblem, config_in_manifests
from cloudscale_autoscaler.config.pricing import price_text, pricing_text
from cloudscale_autoscaler.config.yamlfile import YamlProblem, read_document
from cloudscale_autoscaler.engine.catalogue_check import (
    Catalogue,
    catalogue_errors,
    fetch_catalogue,
    interface_errors,
    known,
    networks_to_check,
)
from cloudscale_autoscaler.journal.file import FILE_NAME as JOURNAL_FILE
from cloudscale_autoscaler.journal.file import default_directory
from cloudscale_autoscaler.observability.logs import to_stderr
from cloudscale_autoscaler.settings.types import Config, ConfigError, NodeGroupConfig, PricingConfig

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INVALID = 2
# An interactive check should fail within seconds, not after the server's full retry budget.
ONLINE_MAX_RETRIES = 1


STDIN = Path("-")
STDIN_ONLY_OFFLINE = "standard input (--config -) is read only with --offline"
# What `serve` checks before it listens that --offline leaves out with the loader's own.
START_CHECKS_SKIPPED = (
    "tls: certificate, key and client CA not loaded nor matched (offline)",
    "kubernetes: credentials and the Lease namespace not checked (offline)",
)


def run_check(path: Path, online: bool, offline: bool = False) -> int:
    if offline:
        return _offline(path)
    if path == STDIN:
        _print_errors(f"{path}: invalid config", [STDIN_ONLY_OFFLINE])
        return EXIT_INVALID
    config, errors = validate(path)
    return _report(str(path), config, errors, [], online=online)


def _offline(path: Path) -> int:
    """--offline: the file, or standard input (`-`), holds a config or rendered manifests
    (`helm template`, `kustomize build`) with the provider's ConfigMap."""
    try:
        text = sys.stdin.read() if path == STDIN else read_document(path)
        found = config_in_manifests(text)
    except ManifestProblem as exc:
        _print_errors(f"{path}: invalid config", [f"{path}: {exc}"])
        return EXIT_INVALID
    except (OSError, UnicodeDecodeError, YamlProblem) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        _print_errors(f"{path}: invalid config", [f"{path}: cannot read: {reason}"])
        return EXIT_INVALID
    shown = "standard input" if path == STDIN else str(path)
    where = shown if found is None else f"{shown} ({found[0]})"
    if found is None and path != STDIN:
        return _report(where, *validate_offline(path), online=False)
    with tempfile.TemporaryDirectory(prefix="check-config-") as tmp:
        config_file = Path(tmp) / "config.yaml"
        config_file.write_text(text if found is None else found[1], encoding="utf-8")
        return _report(where, *validate_offline(config_file), online=False)


def _report(
    where: str, config: Config | None, errors: list[str], skipped: list[str], *, online: bool
) -> int:
    if config is None or errors:
        _print_errors(f"{where}: invalid config", errors)
        return EXIT_INVALID
    print(f"{where}: config OK" + (" (offline)" if skipped else ""))
    print(summary(config))
    for warning in config_warnings(config):
        to_stderr(log, logging.WARNING, warning, plain_prefix="warning: ")
    if skipped:
        print(
            f"skipped ({len(skipped)} checks that need the Pod's files, the network or the "
            "cluster; `check-config` without --offline runs them):"
        )
        print("\n".join(f"  {line}" for line in skipped))
    if not online:
        return EXIT_OK
    return _online(config)


def validate_offline(path: Path) -> tuple[Config | None, list[str], list[str]]:
    """Every check that needs neither the files a Pod mounts (TLS, token, kubeconfig), nor
    the network, nor the cluster: the config, its errors and the checks left out."""
    try:
        config, skipped = load_offline(path)
    except ConfigError as exc:
        return exc.partial, list(exc.errors), []
    return config, [], [*skipped, *_start_checks_skipped(config)]


def _start_checks_skipped(config: Config) -> list[str]:
    tls, kube = START_CHECKS_SKIPPED
    return ([] if config.tls.insecure else [tls]) + ([kube] if config.kubernetes else [])


def validate(path: Path, env: Mapping[str, str] | None = None) -> tuple[Config | None, list[str]]:
    """The config and every problem `serve` would refuse it for, found in one pass: the
    loader's, then what `serve` checks before it listens (the TLS files' contents, the
    Kubernetes credentials and Lease namespace) wherever the loader left those settings
    valid. Errors are `<path>: <reason>` lines; the config is None only when the file could
    not be read as a config at all."""
    environment = os.environ if env is None else env
    try:
        config = load_config(path, env=environment)
    except ConfigError as exc:
        if exc.partial is None:
            return None, list(exc.errors)
        return exc.partial, [*exc.errors, *_start_errors(exc.partial, exc.errors, environment)]
    return config, _start_errors(config, [], environment)


def _start_errors(config: Config, found: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """What `serve` would refuse to start with: the same loads and checks, the same messages
    (the TLS files; the Kubernetes credentials and Lease namespace), for each section the
    loader found no problem in (`found`)."""
    from cloudscale_autoscaler.transport.tls import TLSFileError, load_material

    def clean(section: str) -> bool:
        return not any(error.startswith((f"{section}.", f"{section}:")) for error in found)

    errors: list[str] = []
    tls = config.tls
    if not tls.insecure and tls.cert and tls.key and tls.client_ca and clean("tls"):
        try:
            load_material(tls.cert, tls.key, tls.client_ca)
        except TLSFileError as exc:
            errors.append(str(exc))
    if config.kubernetes is not None and clean("kubernetes"):
        outside = outside_pod_error(config.kubernetes, env)
        if outside is not None:  # said without loading the kubernetes package
            return [*errors, outside]
        # Imported only here: without the section nothing loads the kubernetes package.
        from cloudscale_autoscaler.kube.api import KubeConfigError
        from cloudscale_autoscaler.kube.link import preflight

        try:
            preflight(config.kubernetes)
        except KubeConfigError as exc:
            errors.append(str(exc))
    return errors


def _print_errors(headline: str, errors: Sequence[str]) -> None:
    to_stderr(log, logging.ERROR, headline, errors)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _tls_line(config: Config) -> str:
    tls = config.tls
    if tls.insecure:
        return "INSECURE: plaintext gRPC, no client authentication"
    clients = ", ".join(tls.allowed_clients) or "any certificate the CA signed"
    return f"mTLS, cert {tls.cert}, client CA {tls.client_ca}, allowed clients: {clients}"


def _token_line(config: Config) -> str:
    # Where the token came from, never the token.
    if config.cloudscale.token_file is not None:
        return f"from file {config.cloudscale.token_file}"
    return f"from the {TOKEN_ENV} environment variable"


def group_line(group: NodeGroupConfig, pricing: PricingConfig | None = None) -> str:
    return (
        f"{group.name}: size {group.min_size}-{group.max_size}, flavor {group.flavor}, "
        f"image {group.image}, zone {group.zone or '(project default)'}, "
        f"volume {group.volume_size_gb} GB, {_count(len(group.labels), 'label')}, "
        f"{_count(len(group.taints), 'taint')}, "
        f"options: {'yes' if group.autoscaling_options is not None else 'no'}, "
        f"interfaces: {interfaces_text(group)}"
        + (", managed anti-affinity" if group.anti_affinity else "")
        + (f", pool {group.pool}" if group.pool is not None else "")
        + (f", price {price_text(pricing, group)}" if pricing is not None else "")
    )


def summary(config: Config) -> str:
    cloud = config.cloudscale
    rate = f"{cloud.requests_per_second:g}/s" if cloud.requests_per_second else "unlimited"
    lines = [
        f"cluster:            {config.cluster}",
        f"listen:             {config.listen}",
        f"tls:                {_tls_line(config)}",
        f"metrics:            {config.metrics.listen or 'disabled'}",
        f"api url:            {cloud.url}",
        f"api token:          {_token_line(config)}",
        f"api limits:         timeout {cloud.timeout_seconds:g}s, "
        f"{cloud.max_concurrent_creates} concurrent creates, rate {rate}",
        f"gpu label:          {config.gpu_label}",
        f"placeholder expiry: {config.placeholder_expiry_seconds:g}s",
        f"pricing:            {pricing_text(config.pricing)}",
        f"kubernetes:         {kubernetes_text(config.kubernetes)}",
        f"creation journal:   {_journal_line(config)}",
        f"node groups ({len(config.node_groups)}):",
    ]
    lines += [f"  {group_line(group, config.pricing)}" for group in config.node_groups]
    return "\n".join(lines)


def _journal_line(config: Config) -> str:
    file = _journal_file(config)
    if config.kubernetes is None:
        return file
    election = config.kubernetes.leader_election
    if election.namespace is not None:
        return f"ConfigMap {election.namespace}/{election.journal_name}"
    configmap = f"ConfigMap <pod namespace>/{election.journal_name}"
    return configmap if config.elects else f"{configmap} (outside a Pod: {file})"


def _journal_file(config: Config) -> str:
    if config.state_dir is not None:
        return f"file {config.state_dir / JOURNAL_FILE} (stateDir)"
    directory, why = default_directory(os.environ)
    return f"file {directory / JOURNAL_FILE} ({why})"


async def _fetch_online(
    config: Config,
) -> tuple[Catalogue, tuple[list[Network], list[Subnet]]]:
    """What the online check compares the config with, through one client."""
    from cloudscale_autoscaler.cloud.client import CloudscaleClient

    client = CloudscaleClient.from_config(config.cloudscale)
    client.max_retries = ONLINE_MAX_RETRIES
    async with client:
        return await fetch_catalogue(client), await networks_to_check(config.node_groups, client)


def _online(config: Config) -> int:
    url = config.cloudscale.url
    try:
        (flavors, images, regions), (networks, subnets) = asyncio.run(_fetch_online(config))
    except AuthenticationError as exc:
        _print_errors(
            f"online check against {url} failed",
            [f"cloudscale: the API rejected the token ({_token_line(config)}): {exc}"],
        )
        return EXIT_INVALID
    except CloudError as exc:
        _print_errors(
            f"online check against {url} failed",
            [f"cloudscale.url: the API is unreachable or failing: {exc}"],
        )
        return EXIT_INVALID
    errors = catalogue_errors(config.node_groups, flavors, images, regions)
    errors += interface_errors(config.node_groups, networks, subnets)
    if errors:
        _print_errors(f"online check against {url}", errors)
        return EXIT_INVALID
    print(
        f"online check against {url}: OK ({_count(len(flavors), 'flavor')}, "
        f"{_count(len(images), 'image')}, zones {known([z for r in regions for z in r.zones])})"
    )
    return EXIT_OK
