"""The settings a reload may not change (pure): those the running process was built from.

The transport listens and holds its TLS files, the cloud client its URL, token, timeouts and
limits, the Kubernetes side its connection and Lease, CA its GPU label (read once), and the
cluster tag names every server: changing any of them takes a restart. A reload may change
`nodeGroups`, `pricing`, `placeholderExpiry` and `increaseSizeWait`. The API token is read at
start; a new token (a rotated Secret) also takes a restart, and is never compared or shown.
"""

from __future__ import annotations

from typing import Any

from cloudscale_autoscaler.settings.types import Config

RELOADABLE = ("nodeGroups", "pricing", "placeholderExpiry", "increaseSizeWait")


def _fixed(config: Config) -> dict[str, Any]:
    """Each fixed setting by its config path."""
    tls, cloud = config.tls, config.cloudscale
    return {
        "cluster": config.cluster,
        "listen": config.listen,
        "tls.cert": tls.cert,
        "tls.key": tls.key,
        "tls.clientCA": tls.client_ca,
        "tls.allowedClients": tls.allowed_clients,
        "tls.insecure": tls.insecure,
        "cloudscale.url": cloud.url,
        "cloudscale.tokenFile": cloud.token_file,
        "cloudscale.timeoutSeconds": cloud.timeout_seconds,
        "cloudscale.maxConcurrentCreates": cloud.max_concurrent_creates,
        "cloudscale.requestsPerSecond": cloud.requests_per_second,
        "cloudscale.flavorCacheSeconds": cloud.flavor_cache_seconds,
        "metrics.listen": config.metrics.listen,
        "gpuLabel": config.gpu_label,
        "kubernetes": config.kubernetes,
        "stateDir": config.state_dir,
    }


def fixed_changes(running: Config, new: Config) -> list[str]:
    """`<path>: <reason>` for each fixed setting `new` changes."""
    before, after = _fixed(running), _fixed(new)
    return [
        f"{key}: cannot change without a restart (running {_shown(before[key])}, new "
        f"{_shown(after[key])}); a reload may change {', '.join(RELOADABLE)}"
        for key in before
        if before[key] != after[key]
    ]


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if type(value).__name__.endswith("Config"):
        return "its own section"  # the kubernetes section: too long to show
    return repr(str(value)) if not isinstance(value, bool | int | float) else str(value)
