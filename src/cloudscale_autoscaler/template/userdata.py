"""User-data templates: `${name}` placeholders filled per server, `$${` for a literal `${`.

Pure functions, so the exact kubelet flag syntax is table-tested. The config loader rejects
unknown placeholders at load time; render() checks again so a bad template can never reach a
server half-substituted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Annotations only: the config package imports this module to check user data.
    from cloudscale_autoscaler.settings.types import Taint

PLACEHOLDERS = frozenset({"node_labels", "node_taints", "server_name", "group", "cluster"})

# `$${` escapes; `${name}` substitutes; a `${` that forms neither is an error.
_TOKEN = re.compile(r"\$\$\{|\$\{([A-Za-z0-9_]+)\}|\$\{")


class UserDataError(ValueError):
    """A template that cannot be rendered: unknown or malformed placeholder."""


def format_labels(labels: Iterable[tuple[str, str]]) -> str:
    """kubelet --node-labels form: `k=v,k2=v2`."""
    return ",".join(f"{key}={value}" for key, value in labels)


def format_taints(taints: Iterable[Taint]) -> str:
    """kubelet --register-with-taints form: `k=v:Effect,k2:Effect` (no `=` for empty values)."""
    parts = []
    for taint in taints:
        head = f"{taint.key}={taint.value}" if taint.value else taint.key
        parts.append(f"{head}:{taint.effect}")
    return ",".join(parts)


def placeholders_in(template: str) -> list[str]:
    """Placeholder names used in `template`, in order; `${` that is no placeholder -> error."""
    names = []
    for match in _TOKEN.finditer(template):
        token = match.group(0)
        if token == "$${":
            continue
        if match.group(1) is None:
            raise UserDataError(_malformed(template, match.start()))
        names.append(match.group(1))
    return names


def render(template: str, values: Mapping[str, str]) -> str:
    """Substitute every placeholder; unknown names and stray `${` raise UserDataError."""

    def substitute(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$${":
            return "${"
        name = match.group(1)
        if name is None:
            raise UserDataError(_malformed(template, match.start()))
        if name not in values:
            known = ", ".join(sorted(values))
            raise UserDataError(f"userData: unknown placeholder ${{{name}}} (known: {known})")
        return values[name]

    return _TOKEN.sub(substitute, template)


def _malformed(template: str, offset: int) -> str:
    snippet = template[offset : offset + 20]
    return (
        f"userData: malformed placeholder at offset {offset} ({snippet!r}); "
        "expected ${name} or $${ for a literal ${"
    )
