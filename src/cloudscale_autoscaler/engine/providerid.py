"""Kubernetes providerIDs of cloudscale servers: `cloudscale://<uuid>`.

The cloud controller manager writes the uuid lowercase and hyphenated; we accept any case and
the uuid with or without hyphens, because a providerID may come from elsewhere (a hand-made
Node, an older CCM) and CA asks about every node it sees.
"""

from __future__ import annotations

PREFIX = "cloudscale://"
# Placeholders for failed creations have no server; their instance id is `cloudscale://failed-<id>`.
FAILED_PREFIX = "failed-"

_HEX = frozenset("0123456789abcdef")


def format_provider_id(uuid: str) -> str:
    return PREFIX + uuid


def placeholder_provider_id(placeholder_id: str) -> str:
    return PREFIX + FAILED_PREFIX + placeholder_id


def canonical_uuid(text: str) -> str | None:
    """`text` as a lowercase hyphenated uuid (8-4-4-4-12), or None if it is not a uuid."""
    lowered = text.lower()
    if len(lowered) == 36:
        if any(lowered[i] != "-" for i in (8, 13, 18, 23)):
            return None
        digits = lowered.replace("-", "")
    elif len(lowered) == 32:
        digits = lowered
    else:
        return None
    if len(digits) != 32 or not _HEX.issuperset(digits):
        return None
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def strip_prefix(provider_id: str) -> str | None:
    """The part after `cloudscale://` (prefix matched in any case), or None for other IDs."""
    if len(provider_id) <= len(PREFIX) or provider_id[: len(PREFIX)].lower() != PREFIX:
        return None
    return provider_id[len(PREFIX) :]


def parse_server_uuid(provider_id: str) -> str | None:
    """The canonical server uuid a providerID names, or None (foreign, empty, malformed)."""
    rest = strip_prefix(provider_id)
    return None if rest is None else canonical_uuid(rest)


def parse_placeholder_id(provider_id: str) -> str | None:
    """The placeholder id in `cloudscale://failed-<id>` (exact case, as we wrote it), or None."""
    rest = strip_prefix(provider_id)
    if rest is None or not rest.startswith(FAILED_PREFIX):
        return None
    ident = rest[len(FAILED_PREFIX) :]
    return ident or None
