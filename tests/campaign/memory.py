"""What a campaign leaves in memory: no provider of an example that has ended.

Each example starts providers and stops them; one process runs thousands of examples, so
whatever holds on to a stopped provider holds all of them (the compiled transport's Python
callbacks did, and so did pytest's captured log: campaign/logs.py). Checked once after a
run, when every provider has been stopped.
"""

from __future__ import annotations

import gc
from collections import Counter

from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.observability.metrics import Metrics
from cloudscale_autoscaler.transport.server import RunningServer

KINDS = (Engine, Metrics, RunningServer)


def providers_left() -> dict[str, int]:
    """The parts of stopped providers still alive, by kind (a cycle among a provider's own
    objects is collected first: that is the collector's normal work, not a leak)."""
    gc.collect()
    return dict(Counter(type(o).__name__ for o in gc.get_objects() if isinstance(o, KINDS)))
