"""`cloudscale-autoscaler smoke --config FILE GROUP [--yes]`: prove against the configured API
(the real one, with your token, or the emulator) that one node group's servers are made,
counted and deleted as the provider does it.

It creates one server with the request IncreaseSize sends (engine/spec.py: name, flavor, image,
zone, volume, networks resolved as engine/networks.py does, user data rendered with the
template's labels, the group's and the identity tags; with antiAffinity first a new managed
server group, tagged as engine/placement.py tags them), waits until it runs, checks that the
provider would count it (its listing and NodeGroupForNode, engine/inventory.py; flavor and zone
against the group and the template's labels) and would delete it (DeleteNodes' ownership rule,
engine/group.py), then deletes it and the server group. One tag is added to both,
`k8s-autoscaler-smoke`, so a later run finds what an interrupted one left behind and deletes it
first. Nothing is created without --yes.

Whatever stops it (a failed step, the timeout, Ctrl-C or SIGTERM), it deletes what it made:
the server (found by its request tag, so also when the create's answer was lost) and the
server group. Exit codes: 0 passed (without --yes: the plan was made, nothing created); 1 a
step failed, all cleaned up; 2 invalid config or group; 4 cleanup incomplete, what is left is
named; 130 interrupted, all cleaned up.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from cloudscale_autoscaler.cloud.client import CloudscaleClient
from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.commands.smoke.plan import Plan, StepFailed, make_plan, show_plan
from cloudscale_autoscaler.commands.smoke.steps import Smoke
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.observability.logs import to_stderr
from cloudscale_autoscaler.settings.types import Config, ConfigError, NodeGroupConfig

log = logging.getLogger(__name__)

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_LEFT_BEHIND = 4
EXIT_INTERRUPTED = 130
# A smoke test is interactive: a failing API should show within seconds, not after the
# server's full retry budget (5). Retried answers are 429 and 5xx, as in serve.
MAX_RETRIES = 2


def smoke_command(config_path: Path, group_name: str, *, yes: bool, timeout: float) -> int:
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        to_stderr(log, logging.ERROR, f"{config_path}: invalid config", exc.errors)
        return EXIT_INVALID
    group = next((g for g in config.node_groups if g.name == group_name), None)
    if group is None:
        known = ", ".join(g.name for g in config.node_groups)
        print(
            f"smoke: node group {group_name!r} is not configured (configured: {known})",
            file=sys.stderr,
        )
        return EXIT_INVALID
    return asyncio.run(_smoke(config, group, yes=yes, wait_seconds=timeout))


async def _smoke(config: Config, group: NodeGroupConfig, *, yes: bool, wait_seconds: float) -> int:
    client = CloudscaleClient.from_config(config.cloudscale)
    client.max_retries = MAX_RETRIES
    async with client:
        smoke = Smoke(config, group, client, wait_seconds)
        try:
            plan = await make_plan(config, group, client, smoke.made.request_id, smoke.stamp)
        except StepFailed as failed:
            return _failed(failed, [])
        show_plan(config, group, plan, smoke.timeline)
        if not yes:
            return await _dry_run(smoke)
        return await _run(smoke, plan)


async def _dry_run(smoke: Smoke) -> int:
    try:
        left = await smoke.leftovers()
    except CloudError as error:
        return _failed(StepFailed("leftovers", str(error)), [])
    if left:
        names_left = ", ".join(server.name for server in left)
        print(f"  leftovers:    {names_left}, from earlier smoke runs: --yes deletes them first")
    print("not created: run it again with --yes to create this server, check it and delete it")
    return EXIT_PASSED


async def _run(smoke: Smoke, plan: Plan) -> int:
    """The steps as a task that SIGINT and SIGTERM cancel; then the cleanup, always."""
    steps = asyncio.ensure_future(smoke.run(plan))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, steps.cancel)
    failure: StepFailed | None = None
    try:
        await steps
    except asyncio.CancelledError:
        smoke.timeline.say("interrupted", "cleaning up (a second signal is ignored)")
    except StepFailed as failed:
        failure = failed
        smoke.timeline.say(f"FAILED {failed.step}", f"{failed.reason}; cleaning up")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: None)
    if failure is None and not steps.cancelled():
        print("smoke: passed")
        return EXIT_PASSED
    left = await smoke.cleanup()
    if failure is not None:
        return _failed(failure, left)
    return _report_left(left) or EXIT_INTERRUPTED


def _failed(failure: StepFailed, left: list[str]) -> int:
    print(f"smoke: step {failure.step!r} failed: {failure.reason}", file=sys.stderr)
    return _report_left(left) or EXIT_FAILED


def _report_left(left: list[str]) -> int:
    if left:
        print(f"smoke: LEFT BEHIND, delete by hand: {'; '.join(left)}", file=sys.stderr)
        return EXIT_LEFT_BEHIND
    print("smoke: cleaned up, nothing of this run is left", file=sys.stderr)
    return 0
