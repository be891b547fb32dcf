"""Client-supplied values in status messages and logs, bounded.

A request may carry a megabytes-long group id or node name. Echoed whole, it would push the
status message past the client's receive limit (the client then sees RESOURCE_EXHAUSTED
instead of our answer) and flood the log; cut, it still identifies the value and says how
long it really was.
"""

from __future__ import annotations

# Longer than any valid group name, providerID or node name (at most 253 characters).
ECHO_LIMIT = 256


def clip(value: str, limit: int = ECHO_LIMIT) -> str:
    """`value` itself if at most `limit` characters, else its start and its length:
    `"abc… (3145728 characters)"`."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}… ({len(value)} characters)"
