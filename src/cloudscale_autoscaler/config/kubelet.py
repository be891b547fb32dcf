"""A group's `kubelet:` block, optionally backed by a KubeletConfiguration file.

The file supplies maxPods, systemReserved, kubeReserved and evictionHard (everything else in it
is the kubelet's business and ignored); the block's own values win, key by key. When neither
gives evictionHard the result keeps eviction_hard=None, because a given evictionHard replaces
the kubelet defaults entirely and the template code must know which case applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cloudscale_autoscaler.config.reader import Fields, child, describe, is_number, resolve
from cloudscale_autoscaler.config.values import (
    nonnegative_quantity_error,
    threshold_error,
    unknown_key_reason,
)
from cloudscale_autoscaler.config.yamlfile import FileProblem, YamlProblem, parse_yaml, read_text
from cloudscale_autoscaler.settings.types import DEFAULT_MAX_PODS, KubeletConfig

BLOCK_KEYS = ("maxPods", "systemReserved", "kubeReserved", "evictionHard", "configFile")
RESERVED_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pid")
EVICTION_SIGNALS = (
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
)
MAX_PODS_MAX = 2**31 - 1  # the kubelet's maxPods is an int32
KUBELET_API_VERSION = "kubelet.config.k8s.io/v1beta1"
KUBELET_KIND = "KubeletConfiguration"


@dataclass
class _Values:
    """What one source (block or file) says; None = not given there."""

    max_pods: int | None = None
    system_reserved: dict[str, str] | None = None
    kube_reserved: dict[str, str] | None = None
    eviction_hard: dict[str, str] | None = None


def _merged(base: dict[str, str] | None, top: dict[str, str] | None) -> dict[str, str] | None:
    if base is None and top is None:
        return None
    return {**(base or {}), **(top or {})}


def _pairs(values: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((values or {}).items()))


def _quantity_map(
    fields: Fields, key: str, names: tuple[str, ...], check: Callable[[str], str | None]
) -> dict[str, str] | None:
    """A mapping from known names to quantity strings (plain numbers are accepted: `pid: 1000`)."""
    raw = fields.mapping(key)
    if raw is None:
        return None
    path = fields.at(key)
    out: dict[str, str] = {}
    for name, value in raw.items():
        name_path = child(path, str(name))
        if name not in names:
            fields.issues.add(name_path, unknown_key_reason(str(name), names))
        elif not isinstance(value, str) and not is_number(value):
            fields.issues.add(name_path, f"expected a quantity string, got {describe(value)}")
        elif fields.issues.check(name_path, check(str(value))):
            out[name] = str(value)
    return out


def _read_values(fields: Fields) -> _Values:
    return _Values(
        max_pods=fields.integer("maxPods", minimum=1, maximum=MAX_PODS_MAX),
        system_reserved=_quantity_map(
            fields, "systemReserved", RESERVED_RESOURCES, nonnegative_quantity_error
        ),
        kube_reserved=_quantity_map(
            fields, "kubeReserved", RESERVED_RESOURCES, nonnegative_quantity_error
        ),
        eviction_hard=_quantity_map(fields, "evictionHard", EVICTION_SIGNALS, threshold_error),
    )


def _read_file(block: Fields, base_dir: Path) -> _Values:
    written = block.string("configFile")
    if written is None:
        return _Values()
    file_path = resolve(base_dir, written)
    # Problems inside the file get a path naming it, as written in the config.
    at = f"{block.at('configFile')}({written})"
    try:
        data = parse_yaml(read_text(file_path))
    except FileProblem as problem:
        block.issues.add(block.at("configFile"), str(problem))
        return _Values()
    except YamlProblem as problem:
        block.issues.add(at, str(problem))
        return _Values()
    if not isinstance(data, dict):
        block.issues.add(at, f"expected a KubeletConfiguration mapping, got {describe(data)}")
        return _Values()
    fields = Fields(block.issues, at, data, allowed=None)
    for key, expected in (("apiVersion", KUBELET_API_VERSION), ("kind", KUBELET_KIND)):
        value = fields.raw(key)
        if value != expected:
            shown = "nothing" if value is None else describe(value)
            fields.issues.add(fields.at(key), f'expected "{expected}", got {shown}')
    return _read_values(fields)


def parse_kubelet(block: Fields, base_dir: Path) -> KubeletConfig:
    """`block` is the group's kubelet section (empty Fields when absent)."""
    from_file = _read_file(block, base_dir)
    own = _read_values(block)
    max_pods = own.max_pods if own.max_pods is not None else from_file.max_pods
    eviction = _merged(from_file.eviction_hard, own.eviction_hard)
    return KubeletConfig(
        max_pods=max_pods if max_pods is not None else DEFAULT_MAX_PODS,
        system_reserved=_pairs(_merged(from_file.system_reserved, own.system_reserved)),
        kube_reserved=_pairs(_merged(from_file.kube_reserved, own.kube_reserved)),
        eviction_hard=None if eviction is None else _pairs(eviction),
    )
