"""The docs and help match the product: no pointer outside the repository (nor in the tests),
the quick start says how the demo ends, the help says what the options do, and the package
metadata builds without setuptools deprecation warnings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from fixtures.tools import free_port, run_cli
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Markdown links and backticked paths that look like files.
_LINK = re.compile(r"\]\(([^)#\s]+)")
_ABSOLUTE = re.compile(r"`(/(?:work|root|home|tmp|usr/local)/[^`\s]*)`")


def test_docs_point_at_nothing_outside_the_repository() -> None:
    outside: list[str] = []
    for doc in DOCS:
        text = doc.read_text()
        outside += [f"{doc.name}: {path}" for path in _ABSOLUTE.findall(text)]
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            resolved = (doc.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                outside.append(f"{doc.name}: {target}")
    assert outside == []


# Where the tests and docs might point at this machine's files instead of public sources.
_SCANNED = ("README.md", "docs", "tests", "examples", "deploy", "bench", "src")
_SCANNED_SUFFIXES = {".md", ".py", ".go", ".yaml", ".yml", ".txt", ".toml", ".proto", ".rs"}
_MACHINE_PATH = re.compile(r"/work/|shared/reference/")


def _scanned_files() -> list[Path]:
    """The tracked files under _SCANNED: what a clone carries, not a local run's output (the
    bench's work directory names this machine's paths, and is ignored by git)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *_SCANNED],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [
        ROOT / name
        for name in listed.split("\0")
        if name
        and Path(name).suffix in _SCANNED_SUFFIXES
        and ROOT / name != Path(__file__).resolve()
    ]


def test_tests_and_docs_point_at_no_machine_path() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _scanned_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _MACHINE_PATH.search(line)
    ]
    assert found == []


def test_quick_start_says_how_the_demo_ends() -> None:
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "Ctrl-C" in quick_start and "demo --once" in quick_start
    assert "cloudscale-autoscaler rpc --cloud-config" in quick_start


def test_emulator_help_says_what_the_seed_seeds_and_shows_defaults() -> None:
    done = run_cli("emulator", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "seeds every random decision" in text and "UUIDs" in text and "fault" in text
    for default in ("(default: 127.0.0.1:8087)", "(default: 0)", "(default: 5.0)"):
        assert default in text


@pytest.mark.parametrize(
    ("command", "option", "says"),
    [
        ("emulator", "--token", "not set: accepts any token"),
        ("check-config", "--online", "networks and subnets"),
        ("demo", "--certs-dir", "config, mTLS certificates and CA's cloud-config"),
        ("status", "--url", "GET /status (metrics.listen)"),
        ("check-config", "--offline", "lists each check it skipped"),
        ("smoke", "--yes", "it costs money on the real API"),
        ("rpc", "--node", "looked up in the API"),
    ],
)
def test_every_option_has_help_that_says_what_it_does(command: str, option: str, says: str) -> None:
    done = run_cli(command, "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    described = text.split(f" {option} ", 1)[1].split(" --", 1)[0]
    assert says in described and "None" not in described


def test_package_metadata_has_no_setuptools_deprecation() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_configuration(Distribution(), ROOT / "pyproject.toml")


def _try_it_commands() -> list[str]:
    """The commands of examples/config.yaml's "Try it" header, without their comments."""
    text = (ROOT / "examples" / "config.yaml").read_text()
    block = text.split("# Try it", 1)[1].split("\n#\n", 1)[0]
    lines = [line.removeprefix("#").strip() for line in block.splitlines()[1:]]
    return [re.sub(r"\s+#.*$", "", line) for line in lines]


def test_the_example_try_it_block_runs_as_written(tmp_path: Path) -> None:
    # In a scratch copy, on a free port instead of 8087, without a token in the environment;
    # up to `serve`, which would keep serving (the tests of serve cover it).
    port = str(free_port())
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    config = tmp_path / "examples" / "config.yaml"
    config.write_text(config.read_text().replace("8087", port))
    commands = [c.replace("8087", port) for c in _try_it_commands()]
    assert commands[-1].startswith("cloudscale-autoscaler serve ")
    script = ["set -e", "trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    for command in commands[:-1]:
        script.append(command)
        if command.endswith("&"):  # as long as a person takes to type the next line
            script.append(
                f"until (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; do sleep 0.1; done"
            )
    env = {k: v for k, v in os.environ.items() if k != "CLOUDSCALE_API_TOKEN"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "online check against" in done.stdout and ": OK (" in done.stdout
