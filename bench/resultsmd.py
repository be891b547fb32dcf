"""bench/RESULTS.md holds the full run's report and, after it, the real-CA section: each kind
of run replaces its own part and keeps the other's."""

from __future__ import annotations

from pathlib import Path

REAL_CA_HEADING = "## Real Cluster Autoscaler"


def split(text: str) -> tuple[str, str]:
    """The full run's part and the real-CA section ("" if there is none)."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.rstrip("\n") == REAL_CA_HEADING:
            return "".join(lines[:index]), "".join(lines[index:])
    return text, ""


def _join(main: str, section: str) -> str:
    if not section:
        return main
    return main.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def write_main(path: Path, main: str) -> None:
    """The full run's report, keeping the real-CA section already there."""
    path.write_text(_join(main, split(_read(path))[1]))


def write_real_ca(path: Path, section: str) -> None:
    """The real-CA section (starting with REAL_CA_HEADING), keeping the full run's report."""
    path.write_text(_join(split(_read(path))[0], section))
