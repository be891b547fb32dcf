"""The `cloudscale-autoscaler` command line. Each subcommand lives in its own module of
commands/; this file only parses arguments and dispatches, importing lazily so `--help` stays
fast."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloudscale_autoscaler import __version__


def _global_options(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--log-format and --log-level. The top-level parser holds the defaults; each
    subcommand's takes them too, without defaults of its own (`default` SUPPRESS), so the
    flags work before and after the subcommand and one given after it wins."""
    parser.add_argument(
        "--log-format",
        choices=["plain", "json"],
        default=default or "plain",
        help="plain lines or one JSON object per line, on stderr (default: plain)",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=default or "info",
        help="the least severe level logged (default: info)",
    )


class _SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: it takes the global flags as well."""

    def __init__(self, **kwargs: Any) -> None:
        common = argparse.ArgumentParser(add_help=False)
        _global_options(common, default=argparse.SUPPRESS)
        super().__init__(parents=[common], **kwargs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cloudscale-autoscaler",
        description="Kubernetes Cluster Autoscaler externalgrpc cloud provider for cloudscale.ch",
    )
    _global_options(parser)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_SubcommandParser
    )

    serve = sub.add_parser("serve", help="run the gRPC provider")
    serve.add_argument("--config", type=Path, required=True, help="YAML config file")

    check = sub.add_parser("check-config", help="validate a config file and summarise it")
    check.add_argument("--config", type=Path, required=True)
    where = check.add_mutually_exclusive_group()
    where.add_argument(
        "--online",
        action="store_true",
        help="also check flavors, images, zones, networks and subnets against the cloud API",
    )
    where.add_argument(
        "--offline",
        action="store_true",
        help="lint a config meant for a Pod anywhere (CI): read no TLS, token or kubeconfig "
        "file, resolve no host name, ask no cluster; lists each check it skipped",
    )

    sub.add_parser("version", help="print the version")

    emulator = sub.add_parser(
        "emulator",
        help="run the built-in cloudscale.ch API emulator",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    emulator.add_argument(
        "--listen", default="127.0.0.1:8087", metavar="HOST:PORT", help="address to serve on"
    )
    emulator.add_argument(
        "--token",
        # Absent rather than None, so the help shows no "(default: None)".
        default=argparse.SUPPRESS,
        help="the Bearer token requests must carry; not set: accepts any token",
    )
    emulator.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds every random decision: the UUIDs of created servers, and which requests "
        "an injected fault (set through the admin API) hits; the same seed and requests give "
        "the same results",
    )
    emulator.add_argument(
        "--boot-seconds",
        type=float,
        default=5.0,
        help="how long a new server stays 'changing' before it is 'running'",
    )

    certs = sub.add_parser("certs", help="write development mTLS certificates")
    certs.add_argument("--out", type=Path, required=True)
    certs.add_argument("--dns", action="append", default=[], help="extra server DNS SAN")
    certs.add_argument("--ip", action="append", default=[], help="extra server IP SAN")

    template = sub.add_parser("template", help="print a group's template Node")
    template.add_argument("--config", type=Path, required=True)
    template.add_argument("group")
    template.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")

    drift = sub.add_parser(
        "drift", help="compare each group's template with its live Nodes (exit 1 on drift)"
    )
    drift.add_argument("--config", type=Path, required=True)
    drift.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="default: kubernetes.kubeconfig, in a pod its service account, else as kubectl",
    )

    status = sub.add_parser(
        "status",
        help="show a running provider's groups, placeholders, last Refresh, leader and "
        "certificate (from its metrics endpoint)",
    )
    status.add_argument(
        "--url",
        # Where the chart and the kustomize base serve it (metrics.listen 0.0.0.0:8080):
        # `kubectl exec` into a provider Pod and run `status` as it is.
        default="http://127.0.0.1:8080/status",
        help="the provider's GET /status (metrics.listen); a bare address gets /status "
        "(default: %(default)s)",
    )
    status.add_argument(
        "-o",
        "--output",
        choices=["table", "json"],
        default="table",
        help="table: for a terminal; json: the document as served (default: %(default)s)",
    )

    smoke = sub.add_parser(
        "smoke",
        help="create one server of a group as IncreaseSize would, check the provider would "
        "count and delete it, delete it (nothing without --yes)",
    )
    smoke.add_argument("--config", type=Path, required=True)
    smoke.add_argument("group", help="the node group (its name as CA sees it: workers-lpg1)")
    smoke.add_argument(
        "--yes",
        action="store_true",
        help="create the server (it costs money on the real API); without it: only the plan",
    )
    smoke.add_argument(
        "--timeout",
        type=_duration,
        default="10m",
        metavar="DURATION",
        help="how long to wait for the server to run, and to be gone after its delete "
        "(default: 10m)",
    )

    rpc = sub.add_parser(
        "rpc",
        help="call one CloudProvider RPC as the Cluster Autoscaler does and print the answer "
        "as JSON",
    )
    rpc.add_argument(
        "--cloud-config",
        type=Path,
        required=True,
        help="CA's externalgrpc cloud-config: address, cert, key, cacert, grpc_timeout",
    )
    rpc.add_argument("method", metavar="METHOD", help="NodeGroups, NodeGroupTargetSize, ...")
    rpc.add_argument(
        "body", nargs="?", metavar="JSON", help='the request, e.g. \'{"id": "workers"}\''
    )
    rpc.add_argument("--group", help="the request's node group id")
    rpc.add_argument(
        "--node",
        action="append",
        default=[],
        help="NodeGroupForNode's node, DeleteNodes' nodes (repeat): cloudscale://<uuid>, a "
        "server UUID or a server name (looked up in the API with the provider's config)",
    )
    rpc.add_argument("--config", type=Path, help="the provider's config, to look server names up")

    demo = sub.add_parser("demo", help="emulator + server + a CA-like scale-up/down timeline")
    demo.add_argument("--once", action="store_true", help="exit after the timeline")
    demo.add_argument(
        "--certs-dir",
        type=Path,
        default=None,
        help="directory for the demo's config, mTLS certificates and CA's cloud-config, kept "
        "for `rpc --cloud-config DIR/cloud-config.yaml` (default: a temporary directory, "
        "removed on exit)",
    )
    return parser


def _duration(text: str) -> float:
    from cloudscale_autoscaler.config.values import parse_go_duration

    try:
        seconds = parse_go_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return seconds


# The shell's convention for a process ended by SIGINT (128 + 2).
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from cloudscale_autoscaler.observability.logs import setup_logging

    setup_logging(args.log_format, args.log_level)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        # Ctrl-C where no handler of a command's own runs (reading the config, resolving
        # names, before serve listens): an ordinary way to stop, not a crash to trace.
        logging.getLogger(__name__).error("interrupted")
        return EXIT_INTERRUPTED


def _dispatch(args: argparse.Namespace) -> int:
    command: str = args.command
    if command == "version":
        print(f"cloudscale-autoscaler {__version__}")
        return 0
    if command == "serve":
        from cloudscale_autoscaler.commands.serve import serve_command

        return serve_command(args.config)
    if command == "check-config":
        from cloudscale_autoscaler.commands.check_config import run_check

        return run_check(args.config, online=args.online, offline=args.offline)
    if command == "emulator":
        from cloudscale_autoscaler.commands.emulator import emulator_command

        token = getattr(args, "token", None)
        return emulator_command(args.listen, token, args.seed, args.boot_seconds)
    if command == "certs":
        from cloudscale_autoscaler.commands.certs import certs_command

        return certs_command(args.out, args.dns, args.ip)
    if command == "template":
        from cloudscale_autoscaler.commands.template import template_command

        return template_command(args.config, args.group, args.output)
    if command == "drift":
        from cloudscale_autoscaler.commands.drift import drift_command

        return drift_command(args.config, args.kubeconfig)
    if command == "status":
        from cloudscale_autoscaler.commands.status import status_command

        return status_command(args.url, args.output)
    if command == "smoke":
        from cloudscale_autoscaler.commands.smoke import smoke_command

        return smoke_command(args.config, args.group, yes=args.yes, timeout=args.timeout)
    if command == "rpc":
        from cloudscale_autoscaler.commands.rpc import RpcArgs, rpc_command

        return rpc_command(
            RpcArgs(args.cloud_config, args.method, args.body, args.group, args.node, args.config)
        )
    if command == "demo":
        from cloudscale_autoscaler.commands.demo import demo_command

        return demo_command(once=args.once, certs_dir=args.certs_dir)
    raise AssertionError(f"unhandled command {command}")


if __name__ == "__main__":
    sys.exit(main())
