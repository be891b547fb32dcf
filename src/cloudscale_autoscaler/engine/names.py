"""Names and ids for new servers.

A server name becomes the Node name and the host name, so it must be one DNS label:
lowercase [a-z0-9-], at most 63 characters, no leading/trailing hyphen.
"""

from __future__ import annotations

import secrets
import string

from cloudscale_autoscaler.config.values import LABEL_NAME_MAX, SUFFIX_LENGTH

_ALPHABET = string.ascii_lowercase + string.digits


def random_suffix(length: int = SUFFIX_LENGTH) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def server_name(cluster: str, group: str, suffix: str) -> str:
    """`<cluster>-<group>-<suffix>`, the prefix shortened so the whole stays one DNS label."""
    room = LABEL_NAME_MAX - len(suffix) - 1
    prefix = f"{cluster}-{group}".lower()[:room].strip("-")
    return f"{prefix}-{suffix}" if prefix else suffix


def request_id() -> str:
    """Unique per create request; goes into the k8s-autoscaler-request tag."""
    return secrets.token_hex(8)
