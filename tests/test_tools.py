"""The test tools' installer (fixtures/tools.py): a failed build is paid for once, and Go is
found without a machine-specific path."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.tools import (
    GRPCURL,
    ToolUnavailable,
    failure_file,
    failure_stamp,
    go_binary,
    install,
    tools_dir,
)

# A module the proxy can never serve; GOPROXY=off makes the build fail at once, offline.
BROKEN = dataclasses.replace(
    GRPCURL, name="no-such-tool", package="example.invalid/no-such-tool", version="v0.0.1"
)


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("GOPROXY", "off")
    return tmp_path


def test_a_failed_build_is_remembered_with_its_reason(empty_cache: Path) -> None:
    if go_binary() is None:
        pytest.fail("no Go toolchain: the tests that need grpcurl, helm and kustomize cannot run")
    with pytest.raises(ToolUnavailable) as first:
        install(BROKEN)
    assert "failed" in str(first.value) and "GOPROXY=off" in str(first.value)
    stamp = failure_file(BROKEN)
    assert stamp.parent == tools_dir() and stamp.is_relative_to(empty_cache)
    built_with = stamp.read_text().partition("\n")[0]
    assert built_with.startswith("go version go")

    # The next run does not build again: it says at once why, and how to retry.
    written = stamp.stat().st_mtime_ns
    with pytest.raises(ToolUnavailable) as again:
        install(BROKEN)
    assert "failed before" in str(again.value) and str(stamp) in str(again.value)
    assert "GOPROXY=off" in str(again.value)
    assert stamp.stat().st_mtime_ns == written

    # CI's prebuild (`python -m fixtures.tools`) retries regardless, and records anew.
    with pytest.raises(ToolUnavailable) as retried:
        install(BROKEN, retry=True)
    assert "failed before" not in str(retried.value)


def test_a_failure_recorded_under_another_go_is_retried(empty_cache: Path) -> None:
    stamp = failure_file(BROKEN)
    stamp.parent.mkdir(parents=True)
    stamp.write_text("go version go1.0 linux/amd64\nan old reason")
    with pytest.raises(ToolUnavailable) as exc:
        install(BROKEN)
    assert "an old reason" not in str(exc.value) and "GOPROXY=off" in str(exc.value)


def test_go_is_found_off_path_through_goroot(monkeypatch: pytest.MonkeyPatch) -> None:
    real = go_binary()
    if real is None:
        pytest.fail("no Go toolchain on this machine")
    goroot = subprocess.run(
        [real, "env", "GOROOT"], capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("GOROOT", goroot)
    found = go_binary()
    assert found is not None and Path(found).resolve() == (Path(goroot) / "bin" / "go").resolve()
    assert os.access(found, os.X_OK)


def test_no_test_hard_codes_where_go_lives() -> None:
    tests = Path(__file__).parent
    offenders = [
        str(path.relative_to(tests))
        for path in tests.rglob("*.py")
        if path.name != Path(__file__).name and "/usr/local/go" in path.read_text()
    ]
    # fixtures/tools.py names it once, as one of Go's standard install locations.
    assert offenders == ["fixtures/tools.py"]


@pytest.fixture
def no_modules(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty module cache with the proxy off: building kube-apiserver fails at once."""
    monkeypatch.setenv("GOMODCACHE", str(empty_cache / "mod"))
    return empty_cache


def test_a_failed_kube_apiserver_build_is_remembered(no_modules: Path) -> None:
    if go_binary() is None:
        pytest.fail("no Go toolchain: the tests against a real kube-apiserver cannot run")
    from fixtures.kube import ensure_apiserver, pinned_version

    with pytest.raises(ToolUnavailable) as first:
        ensure_apiserver()
    assert "failed" in str(first.value) and "GOPROXY=off" in str(first.value)
    stamp = failure_stamp("kube-apiserver", pinned_version())
    assert stamp.is_relative_to(no_modules)
    written = stamp.stat().st_mtime_ns
    with pytest.raises(ToolUnavailable) as again:
        ensure_apiserver()
    assert "failed before" in str(again.value) and str(stamp) in str(again.value)
    assert stamp.stat().st_mtime_ns == written


def test_the_kube_prebuild_reports_a_failure_without_a_traceback(no_modules: Path) -> None:
    from fixtures.kube import etcd_pin

    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": str(tests)}
    done = subprocess.run(
        [sys.executable, "-m", "fixtures.kube"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    # etcd is the first it builds: the first to fail without modules.
    assert done.stderr.startswith(f"etcd: building etcd {etcd_pin()} ")
    assert "failed" in done.stderr and "GOPROXY=off" in done.stderr
