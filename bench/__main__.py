"""`python -m bench` (from the repository root): see bench/README.md."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
from pathlib import Path

from bench.plan import FULL, PATTERNS, SMOKE
from bench.plots import draw
from bench.report import markdown
from bench.run import run

BENCH_DIR = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a small configuration (N=100, G=1, 2 loops): seconds, for CI",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=BENCH_DIR / "out",
        help="where results.json, results.md, logs and builds go",
    )
    parser.add_argument(
        "--no-results-md",
        action="store_true",
        help="do not copy the table to bench/RESULTS.md (a --smoke run never does)",
    )
    parser.add_argument(
        "--no-plot", action="store_true", help="skip the SVG plots (loop.svg, latency.svg)"
    )
    parser.add_argument(
        "--pattern",
        action="append",
        choices=sorted(PATTERNS),
        help="CA loop pattern(s) to run, by CA generation (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    out: Path = args.out.resolve()
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
        # The plots sit beside RESULTS.md, which links them by name.
        for path in [out / "results.md", *plots]:
            target = "RESULTS.md" if path.name == "results.md" else path.name
            shutil.copyfile(path, BENCH_DIR / target)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
