"""Shared fixtures live in tests/fixtures/, one module per area, loaded as plugins."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest_plugins = [
    "fixtures.tools",  # first: the other plugins import it
    "fixtures.hypothesis_profiles",
    "fixtures.tls",
    "fixtures.emulator",
    "fixtures.stack",
    "fixtures.kube",
    "fixtures.image",
    "fixtures.node",
    "fixtures.registry",
    "fixtures.virtual_time",
]


@pytest.fixture(autouse=True, scope="module")
def _module_journal_place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for the providers a module-scoped fixture starts: fixtures of a wider scope
    are set up before any test's own, so _journal_place comes too late for them, and two
    modules' providers of different clusters met in the default place (the second refused
    every IncreaseSize: a journal written for another cluster)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STATE_DIRECTORY", str(tmp_path_factory.mktemp("state")))
        patch.delenv("XDG_STATE_HOME", raising=False)
        yield


@pytest.fixture(autouse=True)
def _journal_place(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every provider a test starts without stateDir (in process or a `serve` it spawns)
    keeps its creation journal in a directory of that test's own, as the default place
    (journal/file.py) would be a shared one, across tests and workers."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)


# The longest modules start first, one on each of the two workers (pyproject.toml's addopts):
# the release's wheel builds (about 5 min) and the real CA's scenarios (about 6 min), then the
# real node's (about 2.5 min: the chart, CA through it, the kustomize base). Reached last,
# any of them kept one worker busy for minutes after the other had run out of work.
LONGEST_FIRST = ("test_release.py", "test_ca_real.py", "test_real_node.py")


def _rank(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: the rest keep their order


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
