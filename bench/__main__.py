"""`python -m bench` (from the repository root): see bench/README.md."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from bench import resultsmd
from bench.plan import FULL, PATTERNS, SMOKE, NodeMemoryPlan, RealCaPlan
from bench.plots import draw
from bench.report import markdown
from bench.run import run

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_MD = BENCH_DIR / "RESULTS.md"
REAL_CA_SIZES = (1000, 5000)


def _sizes(text: str) -> tuple[int, ...]:
    """ "1000,5000" -> (1000, 5000)."""
    sizes = []
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) < 1:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not a positive whole number")
        sizes.append(int(item))
    return tuple(sizes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--workload",
        choices=("default", "real-ca", "node-memory"),
        default="default",
        help="default: the Go client's workloads (a-f); real-ca: the real Cluster Autoscaler "
        "binaries against N idle nodes (minutes per generation and size); node-memory: the "
        "chart's Pods on a real kubelet, their memory at idle and under CA's loop (minutes)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=BENCH_DIR / "out",
        help="where the JSON, the markdown, logs and builds go",
    )
    parser.add_argument(
        "--no-results-md",
        action="store_true",
        help="do not write bench/RESULTS.md (a --smoke run never does)",
    )
    default = parser.add_argument_group("the default workload")
    default.add_argument(
        "--smoke",
        action="store_true",
        help="a small configuration (N=100, G=1, 2 loops): seconds, for CI",
    )
    default.add_argument(
        "--no-plot", action="store_true", help="skip the SVG plots (loop.svg, latency.svg)"
    )
    default.add_argument(
        "--pattern",
        action="append",
        choices=sorted(PATTERNS),
        help="CA loop pattern(s) to run, by CA generation (repeatable; default: all)",
    )
    real_ca = parser.add_argument_group("--workload real-ca")
    real_ca.add_argument("--sizes", type=_sizes, help="N, comma-separated (default: 1000,5000)")
    real_ca.add_argument(
        "--generations",
        help="CA versions as tests/fixtures/autoscaler.py pins them, comma-separated "
        "(default: all)",
    )
    both = parser.add_argument_group("--workload real-ca and node-memory")
    both.add_argument(
        "--loops",
        type=int,
        help="loops measured after the first one (default: 5 real-ca, 6 node-memory)",
    )
    both.add_argument("--scan-interval", type=int, help="CA's --scan-interval, s (default: 10)")
    memory = parser.add_argument_group("--workload node-memory")
    memory.add_argument(
        "--nodes", type=_sizes, help="Ready Nodes of the group under CA's loop (default: 1000)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    # httpx logs every request at INFO (the fixtures poll kube-apiserver's /readyz with it).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    out: Path = args.out.resolve()
    _refuse_foreign_options(parser, args)
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    for flag, value in (("--loops", args.loops), ("--scan-interval", args.scan_interval)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if args.workload == "real-ca":
        return _real_ca(parser, args, out, command)
    if args.workload == "node-memory":
        return _node_memory(parser, args, out, command)
    return _default(args, out)


# Each option and the workloads it applies to.
OPTION_WORKLOADS = {
    "--smoke": ("smoke", ("default",)),
    "--pattern": ("pattern", ("default",)),
    "--no-plot": ("no_plot", ("default",)),
    "--sizes": ("sizes", ("real-ca",)),
    "--generations": ("generations", ("real-ca",)),
    "--loops": ("loops", ("real-ca", "node-memory")),
    "--scan-interval": ("scan_interval", ("real-ca", "node-memory")),
    "--nodes": ("nodes", ("node-memory",)),
}


def _refuse_foreign_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, (attribute, workloads) in OPTION_WORKLOADS.items():
        given = getattr(args, attribute)
        if given not in (None, False) and args.workload not in workloads:
            where = " and ".join(workloads)
            parser.error(f"{flag} applies to --workload {where} only, not to {args.workload}")


def _default(args: argparse.Namespace, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    plan = SMOKE if args.smoke else FULL
    if args.pattern:
        plan = dataclasses.replace(
            plan, loop_patterns=tuple(PATTERNS[name] for name in sorted(set(args.pattern)))
        )
    report = run(plan, out)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plots = [] if args.no_plot else draw(report, out)
    table = markdown(report)
    if plots:
        table += "\n## Plots\n" + "".join(f"\n![{p.stem}]({p.name})\n" for p in plots)
    (out / "results.md").write_text(table)
    if not args.smoke and not args.no_results_md:
        resultsmd.write_main(RESULTS_MD, table)
        # The plots sit beside RESULTS.md, which links them by name.
        for path in plots:
            shutil.copyfile(path, BENCH_DIR / path.name)
    print(table)
    return 0


def _real_ca(parser: argparse.ArgumentParser, args: argparse.Namespace, out: Path,
             command: str) -> int:  # fmt: skip
    # Imported here: it reaches into tests/fixtures, which the default workload does not need.
    from bench.realca import report, testbed
    from bench.realca.run import run_real_ca

    known = list(testbed.GENERATIONS)
    generations = tuple(args.generations.split(",")) if args.generations else tuple(known)
    if unknown := [g for g in generations if g not in known]:
        parser.error(f"--generations: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    plan = RealCaPlan(sizes=args.sizes or REAL_CA_SIZES, generations=generations)
    if args.loops is not None:
        plan = dataclasses.replace(plan, steady_loops=args.loops)
    if args.scan_interval is not None:
        plan = dataclasses.replace(plan, scan_interval_s=args.scan_interval)
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_real_ca(plan, out, command)
    except (testbed.ToolUnavailable, testbed.StartFailed, RuntimeError) as exc:
        # A tool that is missing, a process that did not start or exited, a cluster CA did not
        # see as idle: the reason, with the log tail it names, is the whole story.
        print(f"python -m bench --workload real-ca: {exc}", file=sys.stderr)
        return 1
    _publish(out, "real-ca", result, report.markdown(result), results_md=not args.no_results_md)
    return 0


def _node_memory(parser: argparse.ArgumentParser, args: argparse.Namespace, out: Path,
                 command: str) -> int:  # fmt: skip
    # Imported here: it reaches into tests/fixtures, which the default workload does not need.
    from bench.nodememory import report, testbed
    from bench.nodememory.run import run_node_memory

    plan = NodeMemoryPlan()
    if args.nodes is not None:
        if len(args.nodes) != 1:
            parser.error("--nodes takes one number")
        plan = dataclasses.replace(plan, nodes=args.nodes[0])
    if args.loops is not None:
        plan = dataclasses.replace(plan, loops=args.loops)
    if args.scan_interval is not None:
        plan = dataclasses.replace(plan, scan_interval_s=args.scan_interval)
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_node_memory(plan, out, command)
    except testbed.Unavailable as exc:
        print(f"python -m bench --workload node-memory: {exc.msg}", file=sys.stderr)
        return 1
    except (testbed.ToolUnavailable, testbed.StartFailed, testbed.NotReached,
            RuntimeError) as exc:  # fmt: skip
        print(f"python -m bench --workload node-memory: {exc}", file=sys.stderr)
        return 1
    _publish(out, "node-memory", result, report.markdown(result),
             results_md=not args.no_results_md)  # fmt: skip
    return 0


def _publish(
    out: Path, name: str, result: dict[str, Any], section: str, *, results_md: bool
) -> None:
    """A workload's result as `<name>.json` and `<name>.md` in `out`, its section in
    bench/RESULTS.md (unless not `results_md`), and on stdout."""
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(section)
    if results_md:
        resultsmd.write_section(RESULTS_MD, section)
    print(section)


if __name__ == "__main__":
    sys.exit(main())
