"""Shared fixtures live in tests/fixtures/, one module per area, loaded as plugins."""

from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "fixtures.hypothesis_profiles",
    "fixtures.tls",
    "fixtures.emulator",
    "fixtures.stack",
    "fixtures.kube",
    "fixtures.image",
]

# Set by .ci/run: every tool a test needs is installed there, so a skip is a failure.
NO_SKIPS_ENV = "CLOUDSCALE_AUTOSCALER_NO_SKIPS"


def _skipped(config: pytest.Config) -> int:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return len(reporter.stats.get("skipped", [])) if reporter is not None else 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(NO_SKIPS_ENV) and _skipped(session.config) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = _skipped(terminalreporter.config)
    if os.environ.get(NO_SKIPS_ENV) and skipped:
        terminalreporter.write_line(f"{skipped} skipped with {NO_SKIPS_ENV} set: the run fails")
