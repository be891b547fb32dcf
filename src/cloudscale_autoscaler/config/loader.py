"""YAML config file -> validated `Config`, reporting every problem at once.

`load_config` raises ConfigError whose errors read `<path>: <reason>`, e.g.
`nodeGroups[1].maxSize: must be >= minSize (3)`. Relative paths in the file resolve against the
file's own directory. The API token is read here and never appears in an error or repr.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cloudscale_autoscaler.config.groups import GROUP_KEYS, parse_group
from cloudscale_autoscaler.config.kubernetes import parse_kubernetes
from cloudscale_autoscaler.config.pricing import check_group_prices, parse_pricing
from cloudscale_autoscaler.config.reader import Fields, Issues, as_written, describe, item, resolve
from cloudscale_autoscaler.config.values import (
    LABEL_NAME_MAX,
    SUFFIX_LENGTH,
    dns_label_error,
    http_url_error,
    parse_go_duration,
    parse_host_port,
    qualified_name_error,
)
from cloudscale_autoscaler.config.yamlfile import (
    FileProblem,
    YamlProblem,
    parse_yaml,
    read_document,
    read_text,
)
from cloudscale_autoscaler.observability.logs import register_secret
from cloudscale_autoscaler.settings.types import (
    DEFAULT_API_URL,
    DEFAULT_GPU_LABEL,
    DEFAULT_LISTEN,
    CloudscaleConfig,
    Config,
    ConfigError,
    MetricsConfig,
    NodeGroupConfig,
    TLSConfig,
)
from cloudscale_autoscaler.template.labels import gpu_label_error

log = logging.getLogger(__name__)

TOKEN_ENV = "CLOUDSCALE_API_TOKEN"
TOP_KEYS = (
    "cluster",
    "listen",
    "tls",
    "cloudscale",
    "metrics",
    "gpuLabel",
    "placeholderExpiry",
    "increaseSizeWait",
    "pricing",
    "kubernetes",
    "stateDir",
    "nodeGroups",
)
TLS_KEYS = ("cert", "key", "clientCA", "allowedClients", "insecure")
CLOUDSCALE_KEYS = (
    "url",
    "tokenFile",
    "timeoutSeconds",
    "maxConcurrentCreates",
    "requestsPerSecond",
    "flavorCacheSeconds",
)
METRICS_KEYS = ("listen",)
DEFAULT_PLACEHOLDER_EXPIRY = "15m"
# How long IncreaseSize waits for its first creation's answer: long enough for the API to reject
# a request outright (bad token, quota), short enough to return well inside CA's RPC timeout.
DEFAULT_INCREASE_SIZE_WAIT = "50ms"
NO_TOKEN = f"no API token: set cloudscale.tokenFile or the {TOKEN_ENV} environment variable"


def load_config(path: Path, env: Mapping[str, str] | None = None) -> Config:
    """Parse and validate the config file at `path`; `env` defaults to os.environ."""
    environment = os.environ if env is None else env
    config = _load(path, environment, Issues())
    # Defence in depth: mask the token in any log line, whatever path it takes there.
    register_secret(config.cloudscale.token)
    return config


def load_offline(path: Path) -> tuple[Config, list[str]]:
    """The config at `path` checked without what only its Pod has: the TLS and token files
    are not read (the token stays empty), stateDir is not tried, host names are not resolved,
    the environment is not consulted. Files the config itself refers to (userData.file,
    kubelet.configFile) are read. Returns the config and the checks left out; raises
    ConfigError as load_config does."""
    issues = Issues(offline=True)
    return _load(path, {}, issues), issues.skipped


def _load(path: Path, env: Mapping[str, str], issues: Issues) -> Config:
    data = _read_document(path)
    config = _parse(Fields(issues, "", data, TOP_KEYS), path.absolute().parent, env)
    if issues:
        raise ConfigError(issues.errors, source=str(path), partial=config)
    return config


def _read_document(path: Path) -> dict[Any, Any]:
    try:
        data = parse_yaml(read_document(path))
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"], str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: cannot read: not UTF-8 text"], str(path)) from None
    except YamlProblem as problem:
        raise ConfigError([f"{path}: {problem}"], str(path)) from None
    if not isinstance(data, dict):
        reason = f"expected a mapping of settings at the top level, got {describe(data)}"
        raise ConfigError([f"{path}: {reason}"], str(path))
    return data


def _parse(top: Fields, base_dir: Path, env: Mapping[str, str]) -> Config:
    cluster = top.string("cluster", required=True)
    if cluster is not None and not top.issues.check("cluster", dns_label_error(cluster)):
        cluster = None
    given_listen = _address(top, "listen")
    listen = given_listen or DEFAULT_LISTEN
    # Sections are read in the order a config file usually has them, so errors are too.
    tls = _tls(top.section("tls", TLS_KEYS), base_dir)
    cloudscale = _cloudscale(top.section("cloudscale", CLOUDSCALE_KEYS), base_dir, env)
    # An invalid listen is already reported; comparing metrics.listen with it would only add noise.
    listen_known = given_listen is not None or not top.present("listen")
    metrics = _metrics(top.section("metrics", METRICS_KEYS), listen if listen_known else None)
    gpu_label = top.string("gpuLabel") or DEFAULT_GPU_LABEL
    top.issues.check(top.at("gpuLabel"), _gpu_label_error(gpu_label))
    placeholder_expiry = _duration(
        top, "placeholderExpiry", DEFAULT_PLACEHOLDER_EXPIRY, zero_allowed=False
    )
    increase_wait = _duration(
        top, "increaseSizeWait", DEFAULT_INCREASE_SIZE_WAIT, zero_allowed=True
    )
    pricing = parse_pricing(top)
    kubernetes = parse_kubernetes(top, base_dir)
    state_dir = _state_dir(top, base_dir)
    groups = _groups(top, cluster, base_dir)
    check_group_prices(top, pricing, groups)
    return Config(
        cluster=cluster or "",
        node_groups=groups,
        listen=listen,
        tls=tls,
        cloudscale=cloudscale,
        metrics=metrics,
        gpu_label=gpu_label,
        placeholder_expiry_seconds=placeholder_expiry,
        increase_size_wait_seconds=increase_wait,
        pricing=pricing,
        kubernetes=kubernetes,
        state_dir=state_dir,
    )


def _gpu_label_error(key: str) -> str | None:
    reason = qualified_name_error(key)
    if reason is not None:
        return reason
    reason = gpu_label_error(key)
    if reason is None:
        return None
    return (
        f'"{key}" cannot be the GPU label: {reason}; expected a label key of your own, '
        f'such as "{DEFAULT_GPU_LABEL}" (the default) or "example.com/gpu"'
    )


def _state_dir(top: Fields, base_dir: Path) -> Path | None:
    """A directory this process can write, or create (serve creates it on first write)."""
    written = top.string("stateDir")
    if written is None:
        return None
    path = resolve(base_dir, written)
    if top.issues.offline:
        top.issues.skip("stateDir", f"not checked that {path} is writable (offline)")
        return path
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        top.issues.add("stateDir", f"not a directory: {existing}")
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = (
            f"directory not writable by this process: {path}"
            if existing == path
            else f"cannot create {path}: {existing} is not writable by this process"
        )
        top.issues.add("stateDir", problem)
    return path


def _address(fields: Fields, key: str) -> str | None:
    value = fields.string(key)
    if value is None:
        return None
    try:
        host, _ = parse_host_port(value)
    except ValueError as exc:
        fields.issues.add(fields.at(key), str(exc))
        return None
    host = host.strip("[]")
    if fields.issues.offline and not _is_ip(host):
        fields.issues.skip(fields.at(key), f'host name "{host}" not resolved (offline)')
        return value
    if not fields.issues.check(fields.at(key), _unresolvable(value, host)):
        return None
    return value


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _unresolvable(value: str, host: str) -> str | None:
    """`serve` binds the name, so it must resolve here too: check-config then refuses what
    serve would refuse. IP addresses resolve to themselves without asking DNS."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return f'invalid address "{value}": cannot resolve "{host}" ({exc})'
    return None


_WILDCARDS = ("0.0.0.0", "[::]", "::")


def _metrics(fields: Fields, listen: str | None) -> MetricsConfig:
    address = _address(fields, "listen")
    if address is not None and listen is not None:
        host, port = parse_host_port(address)
        main_host, main_port = parse_host_port(listen)
        overlap = host == main_host or host in _WILDCARDS or main_host in _WILDCARDS
        if port == main_port and overlap:
            fields.issues.add(fields.at("listen"), f"conflicts with listen ({listen})")
    return MetricsConfig(listen=address)


def _duration(top: Fields, key: str, default: str, *, zero_allowed: bool) -> float:
    """A top-level Go duration in seconds; the default's value when absent or invalid."""
    seconds = top.duration(key, example=default)
    if seconds is None:
        return parse_go_duration(default)
    if seconds < 0 or (seconds == 0 and not zero_allowed):
        bound = ">= 0" if zero_allowed else "> 0"
        top.issues.add(key, f"must be {bound}, got {as_written(top.raw(key))}")
    return seconds


def _tls(fields: Fields, base_dir: Path) -> TLSConfig:
    insecure = fields.boolean("insecure") or False
    files: dict[str, Path | None] = {}
    for key in ("cert", "key", "clientCA"):
        written = fields.string(key)
        files[key] = None if written is None else resolve(base_dir, written)
        if insecure:
            continue
        if written is None and not fields.present(key) and fields.valid:
            fields.issues.add(fields.at(key), "required unless tls.insecure is true")
        elif (resolved := files[key]) is not None:
            if fields.issues.offline:
                fields.issues.skip(fields.at(key), f"{resolved} not read (offline)")
            else:
                fields.issues.check(fields.at(key), _readable_file_error(resolved))
    if insecure and any(files.values()):
        log.warning("tls.insecure is true: tls.cert, tls.key and tls.clientCA are ignored")
    return TLSConfig(
        cert=files["cert"],
        key=files["key"],
        client_ca=files["clientCA"],
        allowed_clients=fields.strings("allowedClients"),
        insecure=insecure,
    )


def _readable_file_error(path: Path) -> str | None:
    if not path.exists():
        return f"file not found: {path}"
    if not path.is_file():
        return f"not a regular file: {path}"
    if not os.access(path, os.R_OK):
        return f"file not readable: {path}"
    return None


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value:g}"


def _not_negative(value: float) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value:g}"


def _cloudscale(fields: Fields, base_dir: Path, env: Mapping[str, str]) -> CloudscaleConfig:
    url = fields.string("url") or DEFAULT_API_URL
    fields.issues.check(fields.at("url"), http_url_error(url))
    token, token_file = _token(fields, base_dir, env)
    timeout = fields.number("timeoutSeconds", _positive)
    creates = fields.integer("maxConcurrentCreates", minimum=1)
    flavors = fields.number("flavorCacheSeconds", _not_negative)
    return CloudscaleConfig(
        url=url.rstrip("/"),
        token=token,
        token_file=token_file,
        timeout_seconds=CloudscaleConfig.timeout_seconds if timeout is None else timeout,
        max_concurrent_creates=CloudscaleConfig.max_concurrent_creates
        if creates is None
        else creates,
        requests_per_second=fields.number("requestsPerSecond", _positive),
        flavor_cache_seconds=CloudscaleConfig.flavor_cache_seconds if flavors is None else flavors,
    )


def _token(fields: Fields, base_dir: Path, env: Mapping[str, str]) -> tuple[str, Path | None]:
    """The token and the file it came from. Reasons name the file, never its content."""
    at = fields.at("tokenFile")
    written = fields.string("tokenFile")
    if written is None:
        token = env.get(TOKEN_ENV, "").strip()
        if fields.issues.offline and not fields.present("tokenFile"):
            fields.issues.skip(at, f"not checked that the Pod sets {TOKEN_ENV} (offline)")
        elif not token and not fields.present("tokenFile"):
            fields.issues.add(at, NO_TOKEN)
        return token, None
    path = resolve(base_dir, written)
    if fields.issues.offline:
        fields.issues.skip(at, f"{path} not read (offline)")
        return "", path
    try:
        token = read_text(path).strip()
    except FileProblem as problem:
        fields.issues.add(at, str(problem))
        return "", path
    if not token:
        fields.issues.add(at, f"{path} is empty")
    elif any(ch.isspace() or not ch.isprintable() for ch in token):
        fields.issues.add(at, f"{path} must contain only the token, on one line")
    _warn_if_exposed(path)
    return token, path


def _warn_if_exposed(path: Path) -> None:
    """Warn when users other than this process can read the token. Group read is fine when
    the group is one of ours: that is how a Kubernetes Secret reaches a non-root container
    (defaultMode 0440 with the pod's fsGroup)."""
    info = path.stat()
    mode = info.st_mode & 0o777
    if mode & 0o007:
        exposed_to = "others"
    elif mode & 0o070 and info.st_gid not in {os.getegid(), *os.getgroups()}:
        exposed_to = f"group {info.st_gid}, which this process is not in"
    else:
        return
    log.warning(
        "API token file %s is readable by %s (mode %03o); chmod 600 it", path, exposed_to, mode
    )


def _groups(top: Fields, cluster: str | None, base_dir: Path) -> tuple[NodeGroupConfig, ...]:
    raw = top.sequence("nodeGroups")
    if raw is None and not top.present("nodeGroups"):
        top.issues.add("nodeGroups", "required: at least one node group")
        return ()
    if raw is not None and not raw:
        top.issues.add("nodeGroups", "must contain at least one node group")
    groups: list[NodeGroupConfig] = []
    first_index: dict[str, int] = {}
    for index, entry in enumerate(raw or []):
        path = item("nodeGroups", index)
        if not isinstance(entry, dict):
            top.issues.add(path, f"expected a mapping, got {describe(entry)}")
            continue
        fields = Fields(top.issues, path, entry, GROUP_KEYS)
        for group in parse_group(fields, base_dir):
            groups.append(group)
            _check_name(fields, group, index, first_index)
            _check_server_name_length(fields, cluster, group)
    return tuple(groups)


def _check_name(
    fields: Fields, group: NodeGroupConfig, index: int, first_index: dict[str, int]
) -> None:
    """Each group name once, fanned-out ones (`<name>-<zone>`) included."""
    if not group.name or dns_label_error(group.name) is not None:
        return
    first = first_index.setdefault(group.name, index)
    if first == index:
        return  # its first use (a zone listed twice is reported by the entry itself)
    if group.pool is None:
        reason = f'duplicate of nodeGroups[{first}].name "{group.name}"'
        fields.issues.add(fields.at("name"), reason)
    else:
        reason = f'makes node group "{group.name}", a name nodeGroups[{first}] uses too'
        fields.issues.add(fields.at("zones"), reason)


def _check_server_name_length(fields: Fields, cluster: str | None, group: NodeGroupConfig) -> None:
    """`<cluster>-<group>-<suffix>` is a host name label; with zones the group's name is
    `<name>-<zone>`."""
    name = group.name
    if cluster is None or dns_label_error(name) is not None:
        return
    length = len(cluster) + len(name) + SUFFIX_LENGTH + 2
    if length > LABEL_NAME_MAX:
        together = LABEL_NAME_MAX - SUFFIX_LENGTH - 2
        zone = "" if group.pool is None else f"-{name.removeprefix(group.pool + '-')}"
        budget = (
            f"together at most {together} characters"
            if not zone
            else f'with "{zone}" together at most {together} characters, so at most '
            f"{together - len(zone)} without it"
        )
        fields.issues.add(
            fields.at("name"),
            f'server names "{cluster}-{name}-<{SUFFIX_LENGTH} chars>" would be {length} '
            f"characters, more than the {LABEL_NAME_MAX} a host name label allows; shorten "
            f"the cluster or group name ({budget})",
        )
