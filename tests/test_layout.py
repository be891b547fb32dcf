"""The product's module graph: no import circle, no library module importing a command, every
import running down the rooms' order, template pure and nothing loose at the package root.
The same for the Rust crate's modules (rust/src), read from their `use crate::` lines.

Read from the source with `ast`, not by importing: every import of a product module counts
wherever it stands (a function-level import runs as surely as a top-level one, only later).
Imports under `if TYPE_CHECKING:` never run, but they still say which room leans on which, so
the circle and room checks count them; only "what may run" (template's purity) leaves them
out. Importing `a.b.c` also runs the `__init__` of `a.b` (unless the importer is inside `a.b`,
whose `__init__` is already running), so that counts as an import of `a.b` too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "cloudscale_autoscaler"
ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / PACKAGE
CRATE = ROOT / "rust" / "src"
# The generated protobuf code imports only protobuf and its own siblings.
GENERATED = f"{PACKAGE}.protos"
COMMANDS = f"{PACKAGE}.commands"
# What runs commands: the argument parser and `python -m`.
ENTRY_POINTS = {f"{PACKAGE}.cli", f"{PACKAGE}.__main__"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {_module_name(path): path for path in SOURCE.rglob("*.py")}
    return {name: path for name, path in found.items() if not _within(name, GENERATED)}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(tree: ast.AST, annotations: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement; without `annotations`, only those that can run (all but the
    body of `if TYPE_CHECKING:`)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if not annotations and isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                yield from _imports(ast.Module(body=[branch], type_ignores=[]), annotations)
            continue
        yield from _imports(node, annotations)


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _targets(module: str, path: Path, known: set[str], annotations: bool) -> set[str]:
    """The product modules `module` imports: a submodule a `from` names, or the module whose
    namespace a name is read from."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path)), annotations):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = _base(module, is_package, node)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in known else base)
    return {target for target in targets if target in known}


def _with_packages(module: str, targets: set[str], known: set[str]) -> set[str]:
    """The targets plus the packages whose `__init__` importing them runs: all above each
    target but those `module` is in (their `__init__` is already running)."""
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    out = set(targets)
    for target in targets:
        parts = target.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return {name for name in out if name in known and (name in targets or name not in own)}


def import_graph(annotations: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for module, path in modules.items():
        targets = _with_packages(module, _targets(module, path, known, annotations), known)
        graph[module] = targets - {module}
    return graph


def tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every
    module of one reaches every other, so each sits on an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest circle from the tangle's first module back to itself."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    following.append(succ)
        frontier = following
    return component


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def test_no_import_circle() -> None:
    graph = import_graph()
    found = tangles(graph)
    report = [
        f"{' -> '.join(_short(m) for m in circle(graph, tangle))}  "
        f"(the tangle: {', '.join(_short(m) for m in tangle)})"
        for tangle in found
    ]
    assert not found, "import circle(s) among the product's modules:\n" + "\n".join(report)


def test_no_library_module_imports_a_command() -> None:
    graph = import_graph()
    assert any(_within(module, COMMANDS) for module in graph), f"{COMMANDS} is missing"
    offenders = [
        f"{_short(module)} imports {_short(target)}"
        for module, targets in sorted(graph.items())
        if not _within(module, COMMANDS) and module not in ENTRY_POINTS
        for target in sorted(targets)
        if _within(target, COMMANDS)
    ]
    assert not offenders, "library modules importing a command:\n" + "\n".join(offenders)


# The rooms from the wire down: each may import only rooms after it. Above them all stands the
# assembly (commands/ and the modules at the package root), which no room imports; the
# package's own `__init__` (the version) is below everything.
ROOMS = (
    "transport",
    "kube",
    "service",
    "reload",
    "engine",
    "journal",
    "config",
    "template",
    "cloud",
    "observability",
    "settings",
)
INTERNALS = ROOT / "docs" / "internals.md"


def room_of(module: str) -> str:
    """The top-level package a module is in, or the module itself at the package root; the
    package's own `__init__` is the empty name."""
    return module.removeprefix(PACKAGE).lstrip(".").split(".")[0]


def room_offences(graph: dict[str, set[str]], rooms: tuple[str, ...]) -> list[str]:
    """Every import from a room into a room not below it (or into the assembly)."""
    below = {room: set(rooms[rank + 1 :]) | {""} for rank, room in enumerate(rooms)}
    return [
        f"{_short(module)} imports {_short(target)}"
        for module, targets in sorted(graph.items())
        if room_of(module) in below
        for target in sorted(targets)
        if room_of(target) != room_of(module) and room_of(target) not in below[room_of(module)]
    ]


def test_every_import_runs_downward() -> None:
    graph = import_graph()
    packages = {path.parent.name for path in SOURCE.glob("*/__init__.py")}
    assert packages - {"commands", "protos"} == set(ROOMS), "a room missing from ROOMS, or gone"
    offences = room_offences(graph, ROOMS)
    assert not offences, "imports that run up the rooms' order:\n" + "\n".join(offences)


def test_internals_lists_the_rooms_in_order() -> None:
    """docs/internals.md's Layout names the rooms in the order the test enforces."""
    text = INTERNALS.read_text()
    section = text[text.index("## Layout") :]
    listed = re.findall(r"^- `(\w+)/`", section, flags=re.MULTILINE)
    assert tuple(listed) == ROOMS


def test_room_offences_are_found() -> None:
    graph = {
        f"{PACKAGE}.config.loader": {f"{PACKAGE}.template.labels", f"{PACKAGE}.config.values"},
        f"{PACKAGE}.template.node": {f"{PACKAGE}.config.types", PACKAGE},
        f"{PACKAGE}.engine.engine": {f"{PACKAGE}.status"},
        f"{PACKAGE}.status": {f"{PACKAGE}.engine.status"},
    }
    assert room_offences(graph, ("engine", "config", "template")) == [
        "engine.engine imports status",
        "template.node imports config.types",
    ]


# The package root holds the assembly only; every concept lives in its room (a package).
ROOT_MODULES = {
    "__init__.py",
    "__main__.py",
    "app.py",
    "cli.py",
    "status.py",
    "_transport.pyi",
}


def test_package_root_holds_only_the_assembly() -> None:
    loose = sorted(
        path.name
        for path in SOURCE.iterdir()
        if path.is_file() and path.suffix in {".py", ".pyi"} and path.name not in ROOT_MODULES
    )
    assert (SOURCE / "app.py").is_file(), f"{SOURCE} is not the package"
    assert not loose, f"modules loose at the package root: {', '.join(loose)}"


# What template/ may run: the flavor's model and itself (its settings are annotations).
TEMPLATE = f"{PACKAGE}.template"
TEMPLATE_MAY_IMPORT = (TEMPLATE, f"{PACKAGE}.cloud.models", f"{PACKAGE}.cloud")


def test_template_is_pure() -> None:
    """A group's settings and a flavor in, a Node out: no config loader, no kube/, no API."""
    graph = import_graph(annotations=False)
    assert TEMPLATE in graph
    offenders = [
        f"{_short(module)} imports {_short(target)}"
        for module, targets in sorted(graph.items())
        if _within(module, TEMPLATE)
        for target in sorted(targets)
        if not any(
            target == allowed or _within(target, TEMPLATE) for allowed in TEMPLATE_MAY_IMPORT
        )
    ]
    assert not offenders, "template/ importing more than it may:\n" + "\n".join(offenders)


# The graph reader itself, on sources written here: each must find what it should, or the
# tests above could pass by reading nothing. `runtime` leaves annotation-only imports out.
@pytest.mark.parametrize(
    ("source", "runtime", "annotated"),
    [
        ("from cloudscale_autoscaler.config import Config", {"config"}, {"config"}),
        (
            "from cloudscale_autoscaler.config.types import Taint",
            {"config.types", "config"},
            {"config.types", "config"},
        ),
        (
            "import cloudscale_autoscaler.config.types",
            {"config.types", "config"},
            {"config.types", "config"},
        ),
        (
            "from cloudscale_autoscaler.config import types",
            {"config.types", "config"},
            {"config.types", "config"},
        ),
        (
            "def f():\n    from cloudscale_autoscaler.config import Config",
            {"config"},
            {"config"},
        ),
        ("from .quantity import parse_quantity", {"template.quantity"}, {"template.quantity"}),
        ("from . import quantity", {"template.quantity"}, {"template.quantity"}),
        ("from . import ARCH", {"template"}, {"template"}),
        ("from ..config import Config", {"config"}, {"config"}),
        (
            "if TYPE_CHECKING:\n    from cloudscale_autoscaler.config.types import Config",
            set(),
            {"config.types", "config"},
        ),
        (
            "if typing.TYPE_CHECKING:\n    import cloudscale_autoscaler.config\n"
            "else:\n    import cloudscale_autoscaler.observability.echo",
            {"observability.echo", "observability"},
            {"config", "observability.echo", "observability"},
        ),
    ],
)
def test_reader_finds_imports(
    tmp_path: Path, source: str, runtime: set[str], annotated: set[str]
) -> None:
    names = (
        "config",
        "config.types",
        "observability",
        "observability.echo",
        "template",
        "template.quantity",
        "template.labels",
    )
    known = {f"{PACKAGE}.{name}" for name in names}
    path = tmp_path / "labels.py"
    path.write_text(source + "\n")
    module = f"{PACKAGE}.template.labels"
    for typed, expected in ((False, runtime), (True, annotated)):
        found = _with_packages(module, _targets(module, path, known, typed), known)
        assert {_short(name) for name in found} == expected, f"annotations={typed}"


def test_tangles_and_circle() -> None:
    graph = {"a": {"b"}, "b": {"c", "e"}, "c": {"a"}, "d": {"a"}, "e": {"b"}}
    assert tangles(graph) == [["a", "b", "c", "e"]]
    assert circle(graph, ["a", "b", "c", "e"]) == ["a", "b", "c", "a"]
    assert tangles({"a": {"b"}, "b": set()}) == []


# --- the Rust crate ----------------------------------------------------------------------
# `crate::name`, `crate::{a::x, b}`: what follows is a module of the crate or an item of its
# root (lib.rs). Paths that start at `super::` or `self::` stay inside the file's own module.
_CRATE_PATH = re.compile(r"\bcrate::(?:(\w+)|\{)")
CRATE_ROOT = "lib"


def _braced_heads(text: str, start: int) -> list[str]:
    """The first name of each item in the `{...}` opening at `start`: `{a::{x, y}, b}` -> a, b."""
    heads: list[str] = []
    depth = 0
    item = ""
    for char in text[start:]:
        if char == "{":
            depth += 1
            if depth == 1:
                continue
        elif char == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and char == ",":
            heads.append(item)
            item = ""
        else:
            item += char
    heads.append(item)
    names = (re.match(r"\s*(\w+)", head) for head in heads)
    return [name.group(1) for name in names if name]


def crate_uses(text: str, modules: set[str]) -> set[str]:
    """The crate's modules a file's code names through `crate::` (comments aside); a name that
    is no module is an item of the crate root."""
    code = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
    found: set[str] = set()
    for match in _CRATE_PATH.finditer(code):
        heads = [match.group(1)] if match.group(1) else _braced_heads(code, match.end() - 1)
        found.update(head if head in modules else CRATE_ROOT for head in heads)
    return found


def crate_graph() -> dict[str, set[str]]:
    files = {path.stem: path for path in CRATE.glob("*.rs")}
    modules = set(files)
    return {name: crate_uses(path.read_text(), modules) - {name} for name, path in files.items()}


def test_no_crate_module_circle() -> None:
    graph = crate_graph()
    assert {CRATE_ROOT, "grpc", "wire"} <= set(graph), f"{CRATE} is not the crate's source"
    found = tangles(graph)
    report = [" -> ".join(circle(graph, tangle)) for tangle in found]
    assert not found, "circle(s) among the crate's modules:\n" + "\n".join(report)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("use crate::wire;", {"wire"}),
        ("use crate::grpc::{frame, status};", {"grpc"}),
        ("use crate::{grpc::Core, snapshot::{Answer, Hot}};", {"grpc", "snapshot"}),
        ("use crate::{Server, wire};", {"lib", "wire"}),
        ("    let core = crate::grpc::Core::new();", {"grpc"}),
        ("// use crate::grpc::Core;\nuse super::*;", set()),
        ("use std::sync::Arc; // crate::wire is not used", set()),
    ],
)
def test_crate_reader_finds_uses(source: str, expected: set[str]) -> None:
    assert crate_uses(source, {"lib", "grpc", "snapshot", "wire"}) == expected
