"""Lint, format and type checks run as part of the test suite, so CI enforces them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it is part of the project's test extras")
    return found


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_static_check(command: list[str]) -> None:
    done = subprocess.run(
        [_tool(command[0]), *command[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _cargo() -> str:
    home = Path.home() / ".cargo" / "bin"
    found = shutil.which("cargo") or shutil.which("cargo", path=str(home))
    if found is None:
        pytest.fail("cargo is not installed: .ci/run installs the Rust toolchain")
    return found


@pytest.mark.parametrize(
    "args",
    [
        ["fmt", "--check"],
        ["clippy", "--locked", "--all-targets", "--", "-D", "warnings"],
        ["test", "--locked"],
    ],
    ids=["rustfmt", "clippy", "cargo-test"],
)
@pytest.mark.timeout(1500)
def test_rust_check(args: list[str]) -> None:
    """The transport crate: formatted, clippy-clean, its unit tests pass (a cold build of
    the dependencies takes minutes; CI keeps CARGO_TARGET_DIR between runs)."""
    done = subprocess.run(
        [_cargo(), *args],
        cwd=ROOT / "rust",
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout + done.stderr
