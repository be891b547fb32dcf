"""The documented commands stay true: every ```sh block of README.md, docs/*.md and
bench/README.md is run here, as written, on the emulator, or says right before it why it is
not (`<!-- not run: <reason> -->`).

A block runs with bash (`set -eo pipefail`) in a scratch directory holding copies of examples/
and deploy/, with this virtualenv's `cloudscale-autoscaler` first on PATH and no API token in
the environment. The emulator's documented port 8087 becomes a free one (in the block and in
the copied files), and a line ending in `&` is given until its port answers, as long as a
person takes to type the next line. Blocks that call helm or kustomize get the tools' builds
(tests/fixtures/tools.py; CI builds them before pytest)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.tools import HELM, INSTALL_TIMEOUT_SECONDS, KUSTOMIZE, ensure, free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
_FENCE = re.compile(r"^```(sh|bash|shell)\s*$")
_NOT_RUN = re.compile(r"^<!-- not run: (?P<reason>.+?) -->$")
DOCUMENTED_PORT = "8087"


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence
    text: str
    not_run: str | None  # the reason, when marked

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def shell_blocks(doc: Path) -> list[Block]:
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        if _FENCE.match(lines[index]):
            end = lines.index("```", index + 1)
            before = next((line for line in reversed(lines[:index]) if line.strip()), "")
            marked = _NOT_RUN.match(before.strip())
            text = "\n".join(lines[index + 1 : end])
            blocks.append(Block(doc, index + 1, text, marked["reason"] if marked else None))
            index = end
        index += 1
    return blocks


BLOCKS = [block for doc in DOCS for block in shell_blocks(doc)]
RUNNABLE = [block for block in BLOCKS if block.not_run is None]


def test_each_shell_block_is_run_or_says_why_not() -> None:
    assert len(BLOCKS) >= 20, "the docs' shell blocks were found"
    assert RUNNABLE, "some documented commands are run"
    vague = [b.name for b in BLOCKS if b.not_run is not None and len(b.not_run) < 15]
    assert vague == [], "a reason says why, in words"


def test_other_fences_are_not_shell_in_disguise() -> None:
    """A command block must be ```sh to be seen here: a bare fence holding commands would
    escape the check."""
    disguised = []
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            following = lines[number + 1] if number + 1 < len(lines) else ""
            if line == "```" and following.startswith(
                ("cloudscale-autoscaler ", "kubectl ", "helm ")
            ):
                disguised.append(f"{doc.relative_to(ROOT)}:{number + 1}")
    assert disguised == []


def _script(block: Block, port: str) -> str:
    script = ["set -eo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for line in block.text.replace(DOCUMENTED_PORT, port).splitlines():
        script.append(line)
        if line.rstrip().endswith("&"):
            script.append(
                f"until (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; do sleep 0.1; done"
            )
    return "\n".join(script)


def _workspace(tmp_path: Path, port: str) -> Path:
    for tree in ("examples", "deploy"):
        shutil.copytree(ROOT / tree, tmp_path / tree, symlinks=True)
    config = tmp_path / "examples" / "config.yaml"
    config.write_text(config.read_text().replace(DOCUMENTED_PORT, port))
    return tmp_path


def _path(block: Block) -> str:
    directories = [str(Path(sys.executable).parent)]
    if re.search(r"^helm |\| *helm |^kustomize ", block.text, re.MULTILINE):
        directories += [str(Path(ensure(HELM)).parent), str(Path(ensure(KUSTOMIZE)).parent)]
    return os.pathsep.join([*directories, os.environ.get("PATH", "")])


@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_the_documented_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k != "CLOUDSCALE_API_TOKEN"}
    env["PATH"] = _path(block)
    done = subprocess.run(
        ["bash", "-c", _script(block, port)],
        cwd=_workspace(tmp_path, port),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{block.name}:\n{block.text}\n---\n{done.stdout}{done.stderr}"


def test_a_failing_command_fails_its_block(tmp_path: Path) -> None:
    """The runner is not lenient: a block whose middle command fails fails."""
    block = Block(
        ROOT / "README.md", 0, "true\ncloudscale-autoscaler smoke --config no.yaml x\ntrue", None
    )
    done = subprocess.run(
        ["bash", "-c", _script(block, "1")],
        cwd=tmp_path,
        env={**os.environ, "PATH": _path(block)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "no.yaml" in done.stderr
