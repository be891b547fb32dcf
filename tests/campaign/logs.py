"""What pytest keeps of a campaign's log: the records of the example running, not of all.

A campaign is one pytest test of up to thousands of examples, and pytest's log capture (the
report's "Captured log" section and `caplog`) keeps every record of a test until it ends. A
record keeps its arguments: a CloudError logged by a provider keeps its traceback, whose
frames keep that provider (engine, inventory, metrics registry, HTTP client). So every
provider an example had started stayed in memory for the rest of the run. Each example
starts by dropping what the ones before it logged; the report of a failure shows the log of
the example that failed (Hypothesis runs the minimal one last).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


def forget_earlier_examples(config: pytest.Config) -> Callable[[], None]:
    """Call at the start of each example: drops what pytest captured of the log before."""
    plugin = config.pluginmanager.get_plugin("logging-plugin")  # None with -p no:logging
    handlers = [] if plugin is None else [plugin.caplog_handler, plugin.report_handler]

    def forget() -> None:
        for handler in handlers:
            handler.clear()

    return forget
