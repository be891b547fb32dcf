"""Strict YAML reading: safe types only, duplicate keys refused, errors with line numbers.

Bounded, so no input can crash a command with a traceback: a document of at most
MAX_DOCUMENT_BYTES, nested at most MAX_DEPTH levels (PyYAML composes and constructs
recursively, and ~500 levels exhaust Python's stack). The merge key `<<` works as in YAML 1.1:
the keys written next to it win over the merged ones, and are checked for duplicates.

Plain scalars mean what the YAML 1.2 core schema says, not what PyYAML's YAML 1.1 makes of
them, which surprises: `yes`, `on` and `off` are strings (a label value `on` stays "on";
`useIPv6: yes` is refused where a boolean is expected), `1:30` is a string, not sexagesimal 90,
and dates are strings. Integers are decimal only: `0x10`, `0o17`, `010` and `1_000` stay
strings, refused where a number is expected, rather than guessing between the 1.1 and 1.2
meanings of a leading zero.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

# A config file is a few KiB; its largest part, user data, is usually a file of its own.
MAX_DOCUMENT_BYTES = 1024 * 1024
# A config nests five levels (nodeGroups[0].kubelet.systemReserved.cpu); anchors add none.
MAX_DEPTH = 32
_MERGE_TAG = "tag:yaml.org,2002:merge"
NOT_REGULAR = "not a regular file"


class YamlProblem(Exception):
    """Text that is not valid YAML; str() is the reason with the line, without the content."""


class FileProblem(Exception):
    """A file that cannot be read; str() names the path and the OS's reason."""


# The core schema's plain scalars (yaml.org/spec/1.2.2 10.3.2) with their possible first
# characters ("" is the empty scalar, a null). Integers are decimal without a leading zero, and
# a float has a point or an exponent, so `010` is neither.
_CORE_SCALARS = (
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|", ("", "~", "n", "N")),
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", tuple("tTfF")),
    ("tag:yaml.org,2002:int", r"[-+]?(?:0|[1-9][0-9]*)", tuple("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        tuple("-+.0123456789"),
    ),
    (_MERGE_TAG, r"<<", ("<",)),
)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with the core schema's scalars that refuses duplicate keys: PyYAML silently
    keeps the last one, which would let a second `maxSize:` quietly win over the first."""

    # Its own table, so the YAML 1.1 resolvers SafeLoader registered are not consulted.
    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(
                    problem=f"nested deeper than {MAX_DEPTH} levels",
                    problem_mark=self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # flattened by SafeConstructor below
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

    def _check_core(self, node: yaml.ScalarNode, kind: str, *also: str) -> None:
        """An explicit tag (`!!int 1:30`, `!!bool yes`) gets the core schema's forms only
        (the tag's own, or those of the tags in `also`), not the YAML 1.1 ones PyYAML's
        constructors still read."""
        tags = (node.tag, *also)
        if not any(_CORE_PATTERNS[tag].match(node.value) for tag in tags):
            raise yaml.MarkedYAMLError(
                problem=f'"{node.value}" is not a YAML 1.2 {kind}', problem_mark=node.start_mark
            )

    def construct_core_bool(self, node: yaml.ScalarNode) -> bool:
        self._check_core(node, "boolean (true or false)")
        value: bool = self.construct_yaml_bool(node)
        return value

    def construct_core_int(self, node: yaml.ScalarNode) -> int:
        self._check_core(node, "decimal integer")
        value: int = self.construct_yaml_int(node)
        return value

    def construct_finite_float(self, node: yaml.ScalarNode) -> float:
        """A float, refusing a literal beyond a double's range (`1e400`), which Python would
        quietly read as infinity; `.inf` itself is a number, refused where settings are read."""
        self._check_core(node, "number", "tag:yaml.org,2002:int")  # `!!float 7` is 7.0
        value: float = self.construct_yaml_float(node)
        if math.isinf(value) and "inf" not in node.value.lower():
            raise yaml.MarkedYAMLError(
                problem=f"{node.value} is beyond the range of a number (about 1.8e308)",
                problem_mark=node.start_mark,
            )
        return value


_CORE_PATTERNS = {tag: re.compile(f"^(?:{pattern})$") for tag, pattern, _ in _CORE_SCALARS}
for _tag, _pattern, _first in _CORE_SCALARS:
    _StrictLoader.add_implicit_resolver(_tag, _CORE_PATTERNS[_tag], list(_first))
_StrictLoader.add_constructor("tag:yaml.org,2002:bool", _StrictLoader.construct_core_bool)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_core_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_finite_float)


def parse_yaml(text: str) -> Any:
    """One YAML document; raises YamlProblem("invalid YAML at line L, column C: ...")."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise YamlProblem(_too_large())
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
    except (ValueError, OverflowError) as exc:
        # A scalar Python cannot hold: an integer of thousands of digits, a 31st of February.
        raise YamlProblem(f"invalid YAML: a value cannot be read ({exc})") from None


def _too_large() -> str:
    return f"larger than {MAX_DOCUMENT_BYTES // 1024} KiB: too large for a config file"


def read_document(path: Path) -> str:
    """A YAML file's UTF-8 text, read like the files a config names (see `read_at_most`);
    raises OSError, UnicodeDecodeError, or YamlProblem when the file is too large."""
    data = read_at_most(path, MAX_DOCUMENT_BYTES)
    if data is None:
        raise YamlProblem(_too_large())
    return data.decode("utf-8")


def read_at_most(path: Path, limit: int) -> bytes | None:
    """A regular file's bytes, or None when it holds more than `limit`; reads no more than
    that. Anything else raises OSError (a directory: IsADirectoryError): /dev/zero never ends
    and a FIFO blocks its reader until a writer comes. Opened without blocking and checked
    on the open file, so nothing can swap the file between the check and the read."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as stream:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, NOT_REGULAR, str(path))
        data = stream.read(limit + 1)
    return None if len(data) > limit else data


def read_text(path: Path, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """A regular UTF-8 text file of at most `limit` bytes (see `read_at_most`); raises
    FileProblem naming the path, never the content."""
    try:
        data = read_at_most(path, limit)
    except OSError as exc:
        raise FileProblem(f"cannot read {path}: {exc.strerror or exc}") from None
    if data is None:
        raise FileProblem(f"cannot read {path}: larger than {limit // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileProblem(f"cannot read {path}: not UTF-8 text") from None
