"""Global flags (--log-format, --log-level) work before and after the subcommand, as a real
process: the same JSON error record either way, and one given after the subcommand wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.tools import run_cli


def _bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("cluster: c\nnodeGroupz: []\n")
    return path


def _records(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_format_json_either_side_of_the_subcommand(tmp_path: Path, where: str) -> None:
    config = str(_bad_config(tmp_path))
    command = ["check-config", "--config", config]
    flags = ["--log-format", "json"]
    done = run_cli(*(flags + command if where == "before" else command + flags))
    assert done.returncode == 2, done.stderr
    (record,) = _records(done.stderr)  # JSON, or json.loads fails
    assert record["level"] == "error"
    assert any("nodeGroupz" in str(e) for e in record["errors"])  # type: ignore[attr-defined]


def test_a_flag_after_the_subcommand_wins(tmp_path: Path) -> None:
    config = str(_bad_config(tmp_path))
    done = run_cli(
        "--log-format", "json", "check-config", "--config", config, "--log-format", "plain"
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"{config}: invalid config"), done.stderr


def test_every_subcommand_takes_the_global_flags() -> None:
    done = run_cli("version", "--log-level", "error", "--log-format", "json")
    assert done.returncode == 0 and done.stdout.startswith("cloudscale-autoscaler ")
    for command in ("serve", "check-config", "emulator", "status", "demo", "template"):
        helped = run_cli(command, "--help")
        assert "--log-format" in helped.stdout and "--log-level" in helped.stdout, command


def test_an_unknown_value_after_the_subcommand_is_a_usage_error() -> None:
    done = run_cli("version", "--log-format", "yaml")
    assert done.returncode == 2
    assert "--log-format: invalid choice: 'yaml'" in done.stderr
