"""bench/RESULTS.md holds the full run's report and, after it, one section per other kind of
run (the real CA's, the node-memory run's): each run replaces its own part and keeps the
others'."""

from __future__ import annotations

from pathlib import Path

REAL_CA_HEADING = "## Real Cluster Autoscaler"
NODE_MEMORY_HEADING = "## Memory on a real node"
SECTIONS = (REAL_CA_HEADING, NODE_MEMORY_HEADING)  # their order after the full run's report


def split(text: str) -> tuple[str, dict[str, str]]:
    """The full run's part and each section there, by heading."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") in SECTIONS]
    main = "".join(lines[: starts[0]]) if starts else text
    sections = {}
    # strict=False: without sections the second list holds the end alone.
    for start, end in zip(starts, [*starts[1:], len(lines)], strict=False):
        sections[lines[start].rstrip("\n")] = "".join(lines[start:end])
    return main, sections


def _join(main: str, sections: dict[str, str]) -> str:
    parts = [main.rstrip("\n"), *(sections[h].rstrip("\n") for h in SECTIONS if h in sections)]
    return "\n\n".join(part for part in parts if part) + "\n"


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def write_main(path: Path, main: str) -> None:
    """The full run's report, keeping the sections already there."""
    path.write_text(_join(main, split(_read(path))[1]))


def write_section(path: Path, section: str) -> None:
    """A section (starting with one of SECTIONS' headings), keeping everything else."""
    heading = section.splitlines()[0] if section else ""
    if heading not in SECTIONS:
        raise ValueError(f"a RESULTS.md section starts with one of {SECTIONS}, not {heading!r}")
    main, sections = split(_read(path))
    path.write_text(_join(main, {**sections, heading: section}))
