"""tls.allowedClients: which client certificates may call CloudProvider.

The compiled transport asks once per connection, with the names the verified client
certificate goes by; the answer (None, or the denial it sends as PERMISSION_DENIED) is kept
for the connection's life. Health checks and reflection stay open to any client that passed
the mTLS handshake (the client CA already vouches for it), so monitoring can use its own
certificate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from cloudscale_autoscaler.observability.echo import clip

log = logging.getLogger(__name__)

# Distinct client identities remembered before the cache starts over.
MAX_CACHED_IDENTITIES = 1024
# Names of each kind a denial shows; the rest are counted, so the message stays bounded.
SHOWN_NAMES = 3


class AllowedClients:
    """Admits a client whose certificate CN or one of its DNS SANs is in `allowed`
    (compared case-insensitively)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self._allowed = frozenset(name.lower() for name in allowed)
        # identity (CN values, DNS SAN values) -> None when allowed, else the denial message
        self._decisions: dict[tuple[tuple[str, ...], tuple[str, ...]], str | None] = {}

    def decide(self, common_names: Sequence[str], dns: Sequence[str]) -> str | None:
        """None when a client with these names may call, else why not."""
        key = (tuple(common_names), tuple(dns))
        try:
            return self._decisions[key]
        except KeyError:
            pass
        decision = self._evaluate(*key)
        if len(self._decisions) >= MAX_CACHED_IDENTITIES:
            self._decisions.clear()
        self._decisions[key] = decision
        if decision is not None:
            # The allowed names go to our log only, not to the refused client.
            log.warning("refusing client: %s %s", decision, sorted(self._allowed))
        return decision

    def _evaluate(self, cns: tuple[str, ...], sans: tuple[str, ...]) -> str | None:
        if any(name.lower() in self._allowed for name in (*cns, *sans)):
            return None
        if not cns and not sans:
            return "the client certificate names no CN or DNS SAN; tls.allowedClients needs one"
        who = clip(cns[0] if cns else sans[0])
        return (
            f"client {who!r} (certificate CN {_names(cns)}, DNS SANs {_names(sans)}) "
            "is not in tls.allowedClients"
        )


def _names(names: tuple[str, ...]) -> str:
    """The first SHOWN_NAMES names, each clipped, and how many more there are."""
    if not names:
        return "-"
    shown = [clip(name) for name in names[:SHOWN_NAMES]]
    more = len(names) - len(shown)
    return f"{shown} and {more} more" if more else str(shown)
