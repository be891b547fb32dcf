"""Typed access to parsed YAML that records every problem instead of stopping at the first.

A `Fields` wraps one YAML mapping at a path such as `nodeGroups[1].kubelet`. Its getters check
the value's type and return None when it is absent or wrong (after recording why), so the
caller can go on validating the rest of the file and report everything at once.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudscale_autoscaler.config.values import parse_go_duration, unknown_key_reason

# Keys printed bare in paths; anything else (dots, slashes) is quoted: labels["a.io/b"].
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def child(path: str, key: str) -> str:
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def item(path: str, index: int) -> str:
    return f"{path}[{index}]"


def resolve(base_dir: Path, written: str) -> Path:
    """A path from the config, relative ones against the config's directory, `..` folded so
    messages show the path a person would type."""
    return Path(os.path.normpath(base_dir / written))


_YAML_SPECIAL = {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}


def describe(value: Any) -> str:
    """How a wrong value is shown in `expected X, got <describe>`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        # Written as YAML writes them: `nan` would not read back as a number.
        return f"number {value}" if math.isfinite(value) else f"number {_YAML_SPECIAL[str(value)]}"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"string {json.dumps(shown, ensure_ascii=False)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


class Issues:
    """The growing list of `<path>: <reason>` lines.

    `offline` (check-config --offline, linting a config meant for a Pod elsewhere): the
    checks that need the files the Pod mounts, the network or the cluster are not run; each
    one left out is listed in `skipped` as `<path>: <what was not checked>`."""

    def __init__(self, *, offline: bool = False) -> None:
        self.errors: list[str] = []
        self.offline = offline
        self.skipped: list[str] = []

    def skip(self, path: str, what: str) -> None:
        line = f"{path}: {what}"
        if line not in self.skipped:
            self.skipped.append(line)

    def add(self, path: str, reason: str) -> None:
        """Each line once: a `zones` entry is read once per zone."""
        line = f"{path}: {reason}" if path else reason
        if line not in self.errors:
            self.errors.append(line)

    def check(self, path: str, reason: str | None) -> bool:
        """Record `reason` if there is one; True when the value was fine."""
        if reason is not None:
            self.add(path, reason)
        return reason is None

    def __bool__(self) -> bool:
        return bool(self.errors)


def as_written(value: Any) -> str:
    """A duration as the file has it: `"0s"` quoted, a bare `0` bare."""
    return f'"{value}"' if isinstance(value, str) else str(value)


def duration_type_reason(value: Any, example: str) -> str:
    """Why a value that is no string is no duration: a number needs its unit."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (
            f'expected a duration with a unit such as "{example}" ("{value}s" for {value} '
            f"seconds; only 0 may stand alone), got {describe(value)}"
        )
    return f'expected a duration such as "{example}", got {describe(value)}'


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Fields:
    """One YAML mapping. `allowed=None` accepts any key (used for foreign files we only
    partially read, such as a KubeletConfiguration)."""

    def __init__(
        self, issues: Issues, path: str, data: Mapping[Any, Any], allowed: Sequence[str] | None
    ) -> None:
        self.issues = issues
        self.path = path
        # False for a section that was not a mapping: its `required` keys are not reported
        # again, the type error already says it all.
        self.valid = True
        self.data: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                issues.add(path or "(top level)", f"keys must be strings, got {describe(key)}")
            elif allowed is not None and key not in allowed:
                issues.add(child(path, key), unknown_key_reason(key, allowed))
            else:
                self.data[key] = value

    def at(self, key: str) -> str:
        return child(self.path, key)

    def present(self, key: str) -> bool:
        """Given and not null: `zone:` with no value means the same as leaving it out."""
        return self.data.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.data.get(key)

    def _get(self, key: str, required: bool) -> Any:
        if not self.present(key):
            if required and self.valid:
                self.issues.add(self.at(key), "required")
            return None
        return self.data[key]

    def _wrong(self, key: str, expected: str) -> None:
        self.issues.add(self.at(key), f"expected {expected}, got {describe(self.data[key])}")

    def string(self, key: str, required: bool = False, nonempty: bool = True) -> str | None:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, str):
            self._wrong(key, "a string")
            return None
        if nonempty and not value.strip():
            self.issues.add(self.at(key), "must not be empty")
            return None
        return value

    def integer(
        self,
        key: str,
        required: bool = False,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            self._wrong(key, "an integer")
            return None
        if minimum is not None and value < minimum:
            self.issues.add(self.at(key), f"must be >= {minimum}, got {value}")
            return None
        if maximum is not None and value > maximum:
            self.issues.add(self.at(key), f"must be at most {maximum}, got {value}")
            return None
        return value

    def number(self, key: str, check: Callable[[float], str | None] | None = None) -> float | None:
        """A finite int or float; `check` returns a reason for out-of-range values."""
        value = self._get(key, False)
        if value is None:
            return None
        if not is_number(value) or not math.isfinite(value):
            self._wrong(key, "a finite number" if is_number(value) else "a number")
            return None
        reason = check(float(value)) if check else None
        if not self.issues.check(self.at(key), reason):
            return None
        return float(value)

    def duration(self, key: str, example: str) -> float | None:
        """A Go duration string ("90s", "1h30m") in seconds, or a bare `0` (Go's
        time.ParseDuration takes "0" without a unit, and YAML reads an unquoted 0 as an
        integer); None when absent or invalid (reported). Range rules are the caller's."""
        value = self._get(key, False)
        if value is None:
            return None
        if value == 0 and isinstance(value, int) and not isinstance(value, bool):
            return 0.0
        if not isinstance(value, str):
            self.issues.add(self.at(key), duration_type_reason(value, example))
            return None
        try:
            return parse_go_duration(value)
        except ValueError as exc:
            self.issues.add(self.at(key), str(exc))
            return None

    def boolean(self, key: str) -> bool | None:
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, bool):
            self._wrong(key, "true or false")
            return None
        return value

    def sequence(self, key: str) -> list[Any] | None:
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, list):
            self._wrong(key, "a list")
            return None
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        """A list of strings; wrong items are reported by index and left out."""
        out: list[str] = []
        for index, entry in enumerate(self.sequence(key) or []):
            if isinstance(entry, str):
                out.append(entry)
            else:
                path = item(self.at(key), index)
                self.issues.add(path, f"expected a string, got {describe(entry)}")
        return tuple(out)

    def mapping(self, key: str) -> dict[Any, Any] | None:
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, dict):
            self._wrong(key, "a mapping")
            return None
        return value

    def section(self, key: str, allowed: Sequence[str] | None) -> Fields:
        """A nested mapping; empty when absent or not a mapping (the latter is reported)."""
        data = self.mapping(key)
        fields = Fields(self.issues, self.at(key), data or {}, allowed)
        fields.valid = data is not None or not self.present(key)
        return fields

    def string_map(self, key: str) -> dict[str, str]:
        """A mapping of string to string; wrong entries are reported and left out."""
        out: dict[str, str] = {}
        path = self.at(key)
        for name, value in (self.mapping(key) or {}).items():
            if not isinstance(name, str):
                self.issues.add(path, f"keys must be strings, got {describe(name)}")
            elif not isinstance(value, str):
                self.issues.add(child(path, name), f"expected a string, got {describe(value)}")
            else:
                out[name] = value
        return out
