"""A running `serve` takes a changed config file without a restart (reload/), with the file
replaced the way the kubelet updates a mounted ConfigMap: a new timestamped directory, then an
atomic swap of the `..data` symlink that `config.yaml` points through.

Each test keeps one process (its PID) and reads what CA would: NodeGroups, TargetSize,
TemplateNodeInfo, IncreaseSize and DeleteNodes over mTLS gRPC; /status and /metrics over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import wait_until
from fixtures.tls import PKI, grpc_channel
from fixtures.tools import free_port

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.reload.fixed import fixed_changes
from cloudscale_autoscaler.reload.reloader import ConfigFile, Reloader
from cloudscale_autoscaler.settings.types import Config

CLUSTER = "reload"
RELOADED = 15.0  # the provider checks every 2 s; a loaded machine takes longer to answer


def workers(**fields: Any) -> dict[str, Any]:
    return {"name": "workers", "minSize": 0, "maxSize": 2, "flavor": "flex-4-2",
            "image": "debian-12", "zone": "lpg1", **fields}  # fmt: skip


class Mounted:
    """A config file as a ConfigMap volume presents it: `config.yaml -> ..data/config.yaml`,
    `..data -> ..<timestamp>`, each update a new directory and a symlink swap."""

    def __init__(self, directory: Path, document: dict[str, Any]) -> None:
        directory.mkdir()
        self.directory = directory
        self.path = directory / "config.yaml"
        self._serial = 0
        self.write(document)
        self.path.symlink_to("..data/config.yaml")

    def write(self, document: dict[str, Any] | str) -> None:
        self._serial += 1
        version = self.directory / f"..2026_11_27_00_00_00.{self._serial}"
        version.mkdir()
        text = document if isinstance(document, str) else yaml.safe_dump(document)
        (version / "config.yaml").write_text(text)
        swap = self.directory / "..data_tmp"
        swap.symlink_to(version.name)
        os.replace(swap, self.directory / "..data")  # atomic, as the kubelet's rename


@pytest.fixture
async def mounted(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> AsyncIterator[tuple[Mounted, dict[str, Any], ServeProcess]]:
    """A `serve` process reading a mounted config; the document to edit; the process."""
    written = write_config(tmp_path / "seed", pki, emulator.url, TOKEN, cluster=CLUSTER,
                           groups=[workers()], stateDir=str(tmp_path / "state"),
                           metrics={"listen": "127.0.0.1:0"})  # fmt: skip
    document = yaml.safe_load(written.read_text())
    document["metrics"]["listen"] = f"127.0.0.1:{free_port()}"
    mount = Mounted(tmp_path / "mount", document)
    serve = await start_serve(mount.path, log_level="info", metrics=True)
    try:
        yield mount, document, serve
    finally:
        await serve.kill()


async def call(serve: ServeProcess, pki: PKI, rpc: str, request: Any) -> Any:
    async with grpc_channel(pki, serve.address) as channel:
        return await getattr(pb_grpc.CloudProviderStub(channel), rpc)(request, timeout=10)


async def groups_served(serve: ServeProcess, pki: PKI) -> dict[str, tuple[int, int]]:
    answer = await call(serve, pki, "NodeGroups", pb.NodeGroupsRequest())
    return {g.id: (g.minSize, g.maxSize) for g in answer.nodeGroups}


async def status(serve: ServeProcess) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{serve.metrics_port}/status")
    result: dict[str, Any] = answer.json()
    return result


async def metric(serve: ServeProcess, name: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{serve.metrics_port}/metrics")).text
    (value,) = [float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return value


async def until(condition: Any, what: str) -> None:
    await wait_until(condition, RELOADED, what)


async def test_a_new_group_and_a_larger_max_size_apply_without_a_restart(
    mounted: tuple[Mounted, dict[str, Any], ServeProcess], pki: PKI
) -> None:
    mount, document, serve = mounted
    pid = serve.process.pid
    await call(serve, pki, "Refresh", pb.RefreshRequest())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(serve, pki, "NodeGroupIncreaseSize",
                   pb.NodeGroupIncreaseSizeRequest(id="workers", delta=3))  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    loaded = (await status(serve))["config"]["loaded_unix"]
    document["nodeGroups"] = [workers(maxSize=4),
                              workers(name="extra", zone="rma1", maxSize=1)]  # fmt: skip
    mount.write(document)

    async def served() -> bool:
        return await groups_served(serve, pki) == {"workers": (0, 4), "extra": (0, 1)}

    await until(served, "the new config was never served")
    await call(serve, pki, "NodeGroupIncreaseSize",
               pb.NodeGroupIncreaseSizeRequest(id="workers", delta=3))  # fmt: skip
    await call(serve, pki, "NodeGroupIncreaseSize",
               pb.NodeGroupIncreaseSizeRequest(id="extra", delta=1))  # fmt: skip
    target = await call(serve, pki, "NodeGroupTargetSize",
                        pb.NodeGroupTargetSizeRequest(id="workers"))  # fmt: skip
    assert target.targetSize == 3
    report = (await status(serve))["config"]
    assert report["ok"] is True and report["loaded_unix"] > loaded and report["errors"] == []
    assert await metric(serve, "cloudscale_autoscaler_config_reload_success") == 1.0
    assert serve.process.pid == pid and serve.process.returncode is None


async def test_a_change_while_starting_is_applied(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """The file changes after `serve` loaded it and before it serves (start-up waits for the
    first listing, here held 3 s by the API): the change is applied once it serves, never
    taken for the configuration it runs."""
    written = write_config(tmp_path / "seed", pki, emulator.url, TOKEN, cluster=CLUSTER,
                           groups=[workers()])  # fmt: skip
    document = yaml.safe_load(written.read_text())
    mount = Mounted(tmp_path / "mount", document)
    await emulator.admin.set_faults({"latency": {"list_servers": {"fixed_ms": 3000}}})
    starting = asyncio.create_task(start_serve(mount.path, log_level="info"))
    serve = None
    try:

        async def listing() -> bool:
            return (await emulator.admin.in_flight()).get("list_servers", 0) > 0

        await wait_until(listing, RELOADED, "serve's first listing")
        document["nodeGroups"] = [workers(maxSize=4)]
        mount.write(document)
        serve = await starting
        await emulator.admin.clear_faults()

        async def served() -> bool:
            return await groups_served(serve, pki) == {"workers": (0, 4)}

        await until(served, "the change made while starting was never served")
    finally:
        serve = serve or await starting
        await serve.kill()


async def test_a_changed_template_is_served_at_once(
    mounted: tuple[Mounted, dict[str, Any], ServeProcess], pki: PKI
) -> None:
    mount, document, serve = mounted
    request = pb.NodeGroupTemplateNodeInfoRequest(id="workers")
    await call(serve, pki, "Refresh", pb.RefreshRequest())  # templates built and published
    before = await call(serve, pki, "NodeGroupTemplateNodeInfo", request)
    assert "team" not in core_v1_pb2.Node.FromString(before.nodeBytes).metadata.labels
    document["nodeGroups"] = [workers(labels={"team": "blue"},
                                      userData="#cloud-config\n# ${node_labels}\n")]  # fmt: skip
    mount.write(document)

    async def relabelled() -> bool:
        answer = await call(serve, pki, "NodeGroupTemplateNodeInfo", request)
        labels = core_v1_pb2.Node.FromString(answer.nodeBytes).metadata.labels
        return labels.get("team") == "blue"

    await until(relabelled, "the template never showed the new label")


async def test_a_removed_group_is_not_served_and_its_servers_are_kept(
    mounted: tuple[Mounted, dict[str, Any], ServeProcess], pki: PKI, emulator: RunningEmulator
) -> None:
    mount, document, serve = mounted
    await call(serve, pki, "NodeGroupIncreaseSize",
               pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))  # fmt: skip

    async def two() -> bool:
        return len(await emulator.admin.servers()) == 2

    await until(two, "the servers were never created")
    document["nodeGroups"] = [workers(name="other")]
    mount.write(document)

    async def gone() -> bool:
        return await groups_served(serve, pki) == {"other": (0, 2)}

    await until(gone, "the removed group was still served")
    servers = await emulator.admin.servers()
    node = pb.ExternalGrpcNode(providerID=f"cloudscale://{servers[0]['uuid']}")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(serve, pki, "NodeGroupDeleteNodes",
                   pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node]))  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    left = {"workers": {"servers": 2, "creations_in_flight": 0, "server_groups": 0}}
    assert (await status(serve))["unconfigured_groups"] == left  # at once, before a Refresh
    await call(serve, pki, "Refresh", pb.RefreshRequest())
    assert (await status(serve))["unconfigured_groups"] == left
    assert len(await emulator.admin.servers()) == 2, "a reload never deletes a server"
    assert all(s["tags"][TAG_GROUP] == "workers" and s["tags"][TAG_CLUSTER] == CLUSTER
               for s in await emulator.admin.servers())  # fmt: skip
    assert "node group workers is no longer configured" in serve.output


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        ("nodeGroups: [", "invalid YAML at line 1"),
        ({"maxSize": -1}, "nodeGroups[0].maxSize: must be >= 0, got -1"),
        ({"flavor": "flex-99-99"}, 'nodeGroups[0].flavor: unknown flavor "flex-99-99"'),
        ("cluster: other", "cluster: cannot change without a restart (running 'reload', new "
                           "'other')"),
    ],
    ids=["syntax", "validation", "unknown-flavor", "not-reloadable"],
)  # fmt: skip
async def test_a_refused_reload_keeps_the_running_config_until_a_valid_one(
    mounted: tuple[Mounted, dict[str, Any], ServeProcess],
    pki: PKI,
    edit: str | dict[str, Any],
    error: str,
) -> None:
    mount, document, serve = mounted
    if isinstance(edit, dict):
        mount.write({**document, "nodeGroups": [workers(**edit)]})
    elif edit.startswith("cluster"):
        mount.write({**document, "cluster": "other"})
    else:
        mount.write(edit)

    async def refused() -> bool:
        return (await status(serve))["config"]["ok"] is False

    await until(refused, "the bad file was never refused")
    report = (await status(serve))["config"]
    assert any(error in line for line in report["errors"]), report["errors"]
    assert any(error in line for line in serve.output.splitlines() if "config reload" in line)
    assert await groups_served(serve, pki) == {"workers": (0, 2)}, "the running config changed"
    assert await metric(serve, "cloudscale_autoscaler_config_reload_success") == 0.0
    mount.write({**document, "nodeGroups": [workers(maxSize=3)]})

    async def applied() -> bool:
        return await groups_served(serve, pki) == {"workers": (0, 3)}

    await until(applied, "the next valid file was never applied")
    assert (await status(serve))["config"]["ok"] is True
    assert await metric(serve, "cloudscale_autoscaler_config_reload_success") == 1.0


async def test_a_catalogue_the_client_cannot_read_fails_no_refresh_and_no_reload_for_good(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """The API lists a flavor with 1e999 vCPUs: int() of it raised OverflowError, which failed
    every Refresh (INTERNAL) and ended the reload task for good (SIGHUP did nothing, the
    success metric stayed 1). It is a malformed answer: the flavors are read from the slugs,
    the reload attempt fails, counted, and the file is tried again."""
    await emulator.admin.change_flavor("flex-4-2", vcpu_count=float("inf"))
    written = write_config(
        tmp_path / "seed",
        pki,
        emulator.url,
        TOKEN,
        cluster=CLUSTER,
        groups=[workers()],
        metrics={"listen": f"127.0.0.1:{free_port()}"},
    )
    document = yaml.safe_load(written.read_text())
    mount = Mounted(tmp_path / "mount", document)
    serve = await start_serve(mount.path, log_level="info", metrics=True)
    try:
        await call(serve, pki, "Refresh", pb.RefreshRequest())
        mount.write({**document, "nodeGroups": [workers(maxSize=3)]})

        async def failed() -> bool:
            return await metric(serve, RELOADS + '{outcome="failed"}') >= 1

        await until(failed, "the attempt was never counted as failed")
        assert await metric(serve, "cloudscale_autoscaler_config_reload_success") == 0.0
        assert "malformed API response" in " ".join((await status(serve))["config"]["errors"])
        await emulator.admin.change_flavor("flex-4-2", vcpu_count=2)

        async def applied() -> bool:
            return await groups_served(serve, pki) == {"workers": (0, 3)}

        await until(applied, "the file was never tried again")
        assert await metric(serve, RELOADS + '{outcome="applied"}') == 1
        assert await metric(serve, "cloudscale_autoscaler_config_reload_success") == 1.0
    finally:
        await serve.kill()


async def test_an_apply_that_raises_is_counted_and_the_next_change_applies(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """Whatever goes wrong in an attempt (here the applying step itself) refuses that attempt
    and leaves the reloader running for the next change (the task ended on it)."""
    path = write_config(tmp_path, pki, emulator.url, TOKEN, groups=[workers()])
    running = load_config(path)
    applied: list[int] = []

    async def online_check(config: Config) -> list[str]:
        return []

    async def apply(config: Config) -> None:
        if not applied:
            applied.append(0)
            raise RuntimeError("a bug while applying")
        applied.append(config.node_groups[0].max_size)

    reloader = Reloader(ConfigFile.before_loading(path), running, online_check, apply, 0.05)
    task = asyncio.create_task(reloader.run())
    try:
        document = yaml.safe_load(path.read_text())
        document["nodeGroups"][0]["maxSize"] = 3
        path.write_text(yaml.safe_dump(document))
        await until(lambda: _settled(reloader, 1), "the failing attempt never ended")
        assert reloader.status.ok is False
        assert "a bug while applying" in reloader.status.errors[0]
        document["nodeGroups"][0]["maxSize"] = 4
        path.write_text(yaml.safe_dump(document))
        await until(lambda: _settled(reloader, 2), "the next change was never tried")
        assert (applied, reloader.status.ok, reloader.counts) == (
            [0, 4],
            True,
            {"applied": 1, "refused": 0, "failed": 1},
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _settled(reloader: Reloader, attempts: int) -> bool:
    return sum(reloader.counts.values()) >= attempts


RELOADS = "cloudscale_autoscaler_config_reloads_total"


async def test_sighup_reads_the_file_at_once(
    mounted: tuple[Mounted, dict[str, Any], ServeProcess],
) -> None:
    _, _, serve = mounted
    before = time.time()
    serve.process.send_signal(signal.SIGHUP)

    async def read() -> bool:
        attempt = (await status(serve))["config"]["attempt_unix"]
        return attempt is not None and attempt >= before

    await until(read, "SIGHUP did not make it read the file")
    assert "asked for (SIGHUP)" in serve.output
    assert serve.process.returncode is None


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"listen": "127.0.0.1:1"}, ["listen"]),
        ({"gpu_label": "example.com/gpu"}, ["gpuLabel"]),
        ({"state_dir": Path("/elsewhere")}, ["stateDir"]),
        ({"placeholder_expiry_seconds": 60.0, "increase_size_wait_seconds": 0.0}, []),
        ({"node_groups": ()}, []),
    ],
    ids=["listen", "gpu-label", "state-dir", "reloadable-durations", "groups"],
)  # fmt: skip
def test_what_a_reload_may_not_change_is_named(change: dict[str, Any], refused: list[str]) -> None:
    running = Config(cluster="c", node_groups=(), state_dir=Path("/var/lib/x"))
    problems = fixed_changes(running, replace(running, **change))
    assert [problem.split(":")[0] for problem in problems] == refused
    assert all("cannot change without a restart" in problem for problem in problems)
