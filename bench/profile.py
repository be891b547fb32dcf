"""`python -m bench.profile`: sample our server with py-spy while a workload runs.

py-spy is not a project dependency: `pip install py-spy` into the venv first. Writes the
collapsed stacks (`<workload>.folded`, for flame-graph tools or speedscope) and prints the
functions with the most samples, inclusive and self, to stdout.

    python -m bench.profile loop --size 5000 --groups 10 --pattern 1.36
    python -m bench.profile single --rpc NodeGroupForNode
    python -m bench.profile refresh --size 5000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench import gobuild
from bench.client import GoClient
from bench.plan import PATTERNS
from bench.procs import Processes
from bench.stack import Layout, ServerSettings, make_certs, populate, start_emulator, start_server

BENCH_DIR = Path(__file__).resolve().parent
RATE = 500  # samples per second


def summarize(folded: Path, top: int) -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples"]
    for title, counter in (("inclusive", inclusive), ("self", own)):
        lines.append(f"--- top {top} {title} ---")
        lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in counter.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("workload", choices=["loop", "single", "refresh"])
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument(
        "--rpc",
        default="NodeGroupForNode",
        help="single: NodeGroupForNode, TargetSize or GetOptions",
    )
    parser.add_argument(
        "--pattern",
        choices=sorted(PATTERNS),
        default="1.36",
        help="loop: the CA generation whose loop pattern to run",
    )
    parser.add_argument(
        "--count", type=int, default=2, help="loops / Refresh calls; single: thousands of calls"
    )
    parser.add_argument("--native", action="store_true", help="include native (C) frames")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "out" / "profile")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2

    out: Path = args.out.resolve()
    binaries = gobuild.build(out.parent)
    procs = Processes(out / "logs")
    try:
        pki = make_certs(out / "pki")
        _, admin = start_emulator(procs)
        layout = Layout(args.size, args.groups)
        population = populate(admin, layout)
        server = start_server(procs, out / "server", pki, admin, layout, ServerSettings())
        client = GoClient(binaries.client, pki)
        if args.workload == "loop":
            nodes = out / "nodes.json"
            nodes.write_text(json.dumps({"nodes": population.nodes()}))
            client_args = ["-nodes", str(nodes), "-loops", str(args.count)]
            client_args += PATTERNS[args.pattern].client_args()
        elif args.workload == "refresh":
            client_args = ["-calls", str(args.count)]
        else:
            group = layout.group_names[0]
            target = f"cloudscale://{population.own[group][0]}"
            client_args = [
                "-rpc",
                args.rpc,
                "-provider-id",
                target,
                "-group",
                group,
                "-calls",
                str(args.count * 1000),
                "-warmup",
                "0",
            ]
        folded = out / f"{args.workload}.folded"
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(server.proc.pid),
                "--rate",
                str(RATE),
                "--format",
                "raw",
                "--output",
                str(folded),
                *(["--native"] if args.native else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client.run(args.workload, server, client_args, 600)
        finally:
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
            spy.wait(timeout=60)
    finally:
        procs.stop_all()
    print(summarize(folded, args.top))
    print(f"collapsed stacks: {folded}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
