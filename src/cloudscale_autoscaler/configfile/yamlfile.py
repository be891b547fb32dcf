"""Strict YAML reading: safe types only, duplicate keys refused, errors with line numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlProblem(Exception):
    """Text that is not valid YAML; str() is the reason with the line, without the content."""


class FileProblem(Exception):
    """A file that cannot be read; str() names the path and the OS's reason."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: PyYAML silently keeps the last one, which would
    let a second `maxSize:` quietly win over the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.MarkedYAMLError(
                    problem=f'duplicate key "{key}" (first at line {seen[key]})',
                    problem_mark=key_node.start_mark,
                )
            if isinstance(key, str | int | float | bool):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """One YAML document; raises YamlProblem("invalid YAML at line L, column C: ...")."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = exc.problem or "syntax error"
        if exc.context:
            detail += f" ({exc.context})"
        raise YamlProblem(f"invalid YAML{where}: {detail}") from None
    except yaml.YAMLError as exc:
        raise YamlProblem(f"invalid YAML: {exc}") from None


def read_text(path: Path) -> str:
    """A UTF-8 text file; raises FileProblem naming the path, never the content."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FileProblem(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise FileProblem(f"cannot read {path}: not UTF-8 text") from None
