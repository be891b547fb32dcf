"""The tests' fixtures (tests/fixtures/) importable from the workloads that reuse them: they are
a top-level package of tests/ (pytest's pythonpath), and the bench runs from the repository
root."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parents[1] / "tests")


def add() -> None:
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
