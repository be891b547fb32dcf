""".ci/require: CI stops early, naming what it needs, when a toolchain is missing or too old."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUST_VERSION = re.search(
    r'^rust-version = "(.+)"$', (ROOT / "rust" / "Cargo.toml").read_text(), re.MULTILINE
)


# What .ci/require runs besides the toolchain it checks.
UTILITIES = ("bash", "dirname", "sed", "cut", "sort")


def utilities(home: Path) -> Path:
    """A directory of links to just UTILITIES: /usr/bin may hold a cargo (Debian's cargo-web,
    installed by .ci/run) or a go, and the script must see only the fakes."""
    tools = home / "utilities"
    tools.mkdir(exist_ok=True)
    for name in UTILITIES:
        found = shutil.which(name)
        assert found is not None, f"{name} is not on this machine's PATH"
        (tools / name).symlink_to(found)
    return tools


def require(tool: str, fake_bin: Path, home: Path) -> subprocess.CompletedProcess[str]:
    # PATH holds only the fakes and the utilities (no cargo, no Go, no ~/.cargo/bin on it).
    env = {"PATH": f"{fake_bin}:{utilities(home)}", "HOME": str(home)}
    done = subprocess.run(
        [str(ROOT / ".ci" / "require"), tool],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert "command not found" not in done.stderr, done.stderr
    return done


def fake(fake_bin: Path, name: str, output: str) -> None:
    fake_bin.mkdir(exist_ok=True)
    path = fake_bin / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)


@pytest.mark.parametrize(
    ("version", "accepted"),
    [("1.85.0", False), ("1.87.9", False), ("1.88.0", True), ("1.96.0", True)],
)
def test_rust_older_than_the_crate_s_rust_version_is_refused_naming_it(
    tmp_path: Path, version: str, accepted: bool
) -> None:
    assert RUST_VERSION is not None and RUST_VERSION.group(1) == "1.88"
    fake(tmp_path / "bin", "cargo", f"cargo {version} (debian)")
    done = require("rust", tmp_path / "bin", tmp_path)
    assert (done.returncode == 0) == accepted, done.stderr
    if not accepted:
        assert f"cargo {version} is too old: rust/ needs Rust 1.88 or newer" in done.stderr
        assert "rustc-web" in done.stderr


def test_missing_cargo_is_refused_naming_what_is_needed(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    done = require("rust", tmp_path / "bin", tmp_path)
    assert done.returncode == 1
    assert "cargo is missing: rust/ needs Rust 1.88 or newer" in done.stderr


def test_go_is_found_and_its_version_printed(tmp_path: Path) -> None:
    fake(tmp_path / "bin", "go", "go version go1.99.0 linux/amd64")
    done = require("go", tmp_path / "bin", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "go version go1.99.0 linux/amd64"
