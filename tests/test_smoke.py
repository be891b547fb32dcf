"""`cloudscale-autoscaler smoke`, the real CLI process against the emulator over HTTP: without
--yes it creates nothing; with --yes it creates one server (and its server group) exactly as
IncreaseSize would, checks it and removes both, exit 0. With each injected fault (create
refused, server never running, delete failing, Ctrl-C, SIGKILL) it exits non-zero naming the
step, and leaves no server and no server group behind (a killed run's leftovers are removed by
the next run)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.emulator import TOKEN, FakeClock, RunningEmulator
from fixtures.tools import cli

from cloudscale_autoscaler.commands.smoke import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PASSED,
    MAX_RETRIES,
)
from cloudscale_autoscaler.commands.smoke.plan import TAG_SMOKE

# The server groups the emulator starts with (docs/emulator.md, Catalogue).
START_GROUPS = 3
GROUP = {
    "name": "workers",
    "minSize": 1,
    "maxSize": 3,
    "flavor": "flex-8-4",
    "image": "debian-12",
    "zone": "lpg1",
    "volumeSizeGB": 20,
    "antiAffinity": True,
    "interfaces": [{"network": "public"}, {"network": "k8s-nodes"}],
    "labels": {"role": "worker"},
    "tags": {"team": "platform"},
    "userData": "#cloud-config\nhostname: ${server_name}\n# labels: ${node_labels}\n",
}


def write_config(tmp_path: Path, url: str, **group: Any) -> Path:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    doc = {
        "cluster": "prod",
        "tls": {"insecure": True},
        "cloudscale": {"url": url, "tokenFile": "token"},
        "pricing": {
            "currency": "CHF",
            "flavorsPerHour": {"flex-8-4": "0.0913"},
            "volumePerGBHour": "0.0006",
        },
        "nodeGroups": [{**GROUP, **group}],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Run:
    """One smoke process: its output as it comes, its exit code."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.stdout = ""

    async def until(self, text: str) -> None:
        async with asyncio.timeout(30.0):
            while text not in self.stdout:
                assert self.process.stdout is not None
                line = await self.process.stdout.readline()
                assert line, f"smoke ended before {text!r}:\n{self.stdout}"
                self.stdout += line.decode()

    async def finish(self) -> tuple[int, str, str]:
        out, err = await asyncio.wait_for(self.process.communicate(), 60.0)
        self.stdout += out.decode()
        code = self.process.returncode
        assert code is not None
        return code, self.stdout, err.decode()


async def start(config: Path, *args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "CLOUDSCALE_API_TOKEN"}
    process = await asyncio.create_subprocess_exec(
        *cli("smoke", "--config", str(config), "workers", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    return Run(process)


async def smoke(config: Path, *args: str) -> tuple[int, str, str]:
    return await (await start(config, *args)).finish()


def hold_boots(emulator: RunningEmulator) -> FakeClock:
    """New servers stay "changing" until the test advances the returned clock a minute."""
    clock = emulator.state.clock = FakeClock()
    emulator.state.boot_seconds = 60.0
    return clock


async def assert_nothing_left(emulator: RunningEmulator) -> None:
    assert await emulator.admin.servers() == []
    groups = await emulator.admin._call("GET", "/server-groups")
    assert len(groups) == START_GROUPS and not [g for g in groups if g["tags"]], groups


async def test_without_yes_it_shows_the_plan_and_creates_nothing(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    code, out, _ = await smoke(write_config(tmp_path, emulator.url))
    assert code == EXIT_PASSED
    assert "server:       prod-workers-" in out and "flavor flex-8-4, image debian-12" in out
    assert "networks:     public, network k8s-nodes (7a1c0000-0000-4000-8000-000000000001)" in out
    assert "a new anti-affinity server group prod-workers-" in out
    assert "cost:         0.1033 CHF/h" in out  # 0.0913 + 20 GB x 0.0006
    assert "not created: run it again with --yes" in out
    await assert_nothing_left(emulator)
    stats = await emulator.admin.stats()
    assert not {"create_server", "create_server_group", "delete_server"} & stats.keys(), stats


async def test_yes_creates_one_server_as_increase_size_would_and_removes_it(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    code, out, err = await smoke(write_config(tmp_path, emulator.url), "--yes")
    assert code == EXIT_PASSED, out + err
    for step in ("server group:", "create:", "running:", "counted:", "deletable:", "delete:"):
        assert f"] {step}" in out, step
    assert "NodeGroupForNode(cloudscale://" in out and ") = workers" in out
    assert "nothing left: no server or server group of this run is listed" in out
    await assert_nothing_left(emulator)
    (deleted,) = await emulator.admin.deletions()
    assert deleted["name"].startswith("prod-workers-") and deleted["by"] == "api"
    tags = deleted["tags"]
    assert tags["k8s-cluster"] == "prod" and tags["k8s-autoscaler-group"] == "workers"
    assert tags["team"] == "platform" and len(tags["k8s-autoscaler-request"]) == 16
    assert TAG_SMOKE in tags
    stats = await emulator.admin.stats()
    assert stats["create_server"] == {"201": 1} and stats["create_server_group"] == {"201": 1}
    assert stats["delete_server_group"] == {"204": 1}


async def test_the_create_request_is_increase_size_s(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    """The server as the API made it, seen before smoke deletes it (the emulator's clock held,
    so it stays "changing" until the test has looked): flavor, zone, volume, interfaces,
    server group, user data rendered with the server's name and the template's labels."""
    clock = hold_boots(emulator)
    run = await start(write_config(tmp_path, emulator.url), "--yes")
    await run.until("] create:")
    (server,) = await emulator.admin.servers()
    user_data = (await emulator.admin.user_data())[server["uuid"]]
    clock.advance(3600)
    code, out, err = await run.finish()
    assert code == EXIT_PASSED, out + err
    assert (server["flavor"]["slug"], server["zone"]["slug"]) == ("flex-8-4", "lpg1")
    assert server["volumes"][0]["size_gb"] == 20
    networks = [i["network"]["name"] for i in server["interfaces"]]
    assert networks == ["public", "k8s-nodes"]
    (member_of,) = server["server_groups"]
    assert member_of["name"].startswith("prod-workers-")
    assert user_data == f"#cloud-config\nhostname: {server['name']}\n# labels: role=worker\n"


@pytest.mark.parametrize(
    ("faults", "step"),
    [
        ({"fail_next_creates": {"count": 1, "kind": "invalid"}}, "create"),
        ({"fail_next_deletes": {"count": MAX_RETRIES + 1, "status": 500}}, "delete"),
        ({"quota": {"max_servers": 0}}, "create"),
    ],
    ids=["create refused", "delete failing", "quota"],
)
async def test_a_failed_step_is_named_and_everything_is_removed(
    emulator: RunningEmulator, tmp_path: Path, faults: dict[str, Any], step: str
) -> None:
    await emulator.admin.set_faults(faults)
    code, out, err = await smoke(write_config(tmp_path, emulator.url), "--yes")
    assert code == EXIT_FAILED, out + err
    assert f"smoke: step '{step}' failed:" in err
    assert f"] FAILED {step}:" in out
    assert "smoke: cleaned up, nothing of this run is left" in err
    await assert_nothing_left(emulator)


async def test_a_server_that_never_runs_fails_at_the_timeout_and_is_removed(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    hold_boots(emulator)  # never advanced: the server stays "changing"
    config = write_config(tmp_path, emulator.url)
    code, out, err = await smoke(config, "--yes", "--timeout", "1s")
    assert code == EXIT_FAILED, out + err
    assert "smoke: step 'running' failed: server prod-workers-" in err
    assert "is changing after 1s, not running" in err
    await assert_nothing_left(emulator)


async def test_ctrl_c_cleans_up_and_exits_130(emulator: RunningEmulator, tmp_path: Path) -> None:
    hold_boots(emulator)
    run = await start(write_config(tmp_path, emulator.url), "--yes")
    await run.until("] create:")
    run.process.send_signal(signal.SIGINT)
    code, out, err = await run.finish()
    assert code == EXIT_INTERRUPTED, out + err
    assert "interrupted: cleaning up" in out
    assert "smoke: cleaned up, nothing of this run is left" in err
    await assert_nothing_left(emulator)


async def test_the_next_run_removes_what_a_killed_run_left(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    hold_boots(emulator)
    config = write_config(tmp_path, emulator.url)
    killed = await start(config, "--yes")
    await killed.until("] create:")
    killed.process.kill()  # no cleanup can run
    await killed.finish()
    (left,) = await emulator.admin.servers()
    code, out, _ = await smoke(config)
    assert code == EXIT_PASSED and f"leftovers:    {left['name']}, from earlier smoke runs" in out
    emulator.state.boot_seconds = 0.0  # the next run's server runs at once
    code, out, err = await smoke(config, "--yes")
    assert code == EXIT_PASSED, out + err
    assert f"leftovers: deleting what earlier runs left: server {left['name']}" in out
    await assert_nothing_left(emulator)
    code, out, _ = await smoke(config)
    assert code == EXIT_PASSED and "leftovers:" not in out


async def test_an_unknown_group_or_a_bad_timeout_is_a_clear_error(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    config = write_config(tmp_path, emulator.url)
    process = await asyncio.create_subprocess_exec(
        *cli("smoke", "--config", str(config), "nope"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 2
    assert b"node group 'nope' is not configured (configured: workers)" in err
    code, _, err_text = await smoke(config, "--timeout", "soon")
    assert code == 2 and "--timeout: invalid" in err_text


async def test_a_lost_create_answer_is_found_by_its_request_tag(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    """The client's own recovery (a lookup by the request tag), as in IncreaseSize: the run
    passes, and the one server made is the one deleted."""
    await emulator.admin.set_faults({"lose_create_responses": {"count": 1, "mode": "drop"}})
    code, out, err = await smoke(write_config(tmp_path, emulator.url), "--yes")
    assert code == EXIT_PASSED, out + err
    assert len(await emulator.admin.deletions()) == 1
    await assert_nothing_left(emulator)
