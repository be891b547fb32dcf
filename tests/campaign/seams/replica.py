"""One replica: the real provider built as `serve` builds it (app.build_provider: cloud client,
engine, service, the Kubernetes side with leader election and the journal's ConfigMap), its
serving gate in front of the service, and the reloader of its own config file; CA calls the
service as the transport would, with a deadline.

What is not the product here: the Kubernetes API (kubedouble.py), the transport (CA's calls go
to the gated service directly; the transport has its own tests and campaign) and the way a
replica dies (`kill`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from campaign.seams.clock import OWNER, VirtualLoop
from campaign.seams.kubedouble import KubeView
from campaign.seams.relay import Relay
from cloudscale_autoscaler.app import Provider, build_provider, reload_apply, servicer_of
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.engine.catalogue_check import online_problems
from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.kube.link import ClusterLink
from cloudscale_autoscaler.observability.metrics import Metrics
from cloudscale_autoscaler.reload.reloader import ConfigFile, Reloader
from cloudscale_autoscaler.settings.types import Config
from cloudscale_autoscaler.transport.calls import CallContext, RpcError

NAMESPACE = "kube-system"
# Rounds of cancelling a dead replica's tasks (each may leave new ones behind while it ends).
KILL_ROUNDS = 20


@dataclass
class Answer:
    """What one RPC answered: OK with its reply, or a status code and its details."""

    rpc: str
    code: str
    reply: Any = None
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code == "OK"


@dataclass
class Replica:
    name: str
    path: Path
    view: KubeView
    relay: Relay
    provider: Provider
    servicer: Any
    reloader: Reloader
    dead: bool = False
    calls: list[str] = field(default_factory=list)

    @property
    def engine(self) -> Engine:
        return self.provider.service.engine

    @property
    def config(self) -> Config:
        return self.engine.config

    @property
    def serving(self) -> bool:
        return not self.dead and self.provider.serving.active

    async def call(self, rpc: str, request: Any, deadline: float) -> Answer:
        """`rpc` as the transport calls it, cancelled at the caller's deadline as the
        transport cancels a call whose caller is gone."""
        loop = asyncio.get_running_loop()
        context = CallContext(loop.time() + deadline)
        token = OWNER.set(self.name)  # the call's tasks die with the replica
        try:
            task = asyncio.ensure_future(getattr(self.servicer, rpc)(request, context))
        finally:
            OWNER.reset(token)
        try:
            reply = await asyncio.wait_for(task, deadline)
        except RpcError as error:
            return Answer(rpc, error.code.name, None, error.details)
        except TimeoutError:
            return Answer(rpc, "DEADLINE_EXCEEDED", None, f"no answer within {deadline:g}s")
        return Answer(rpc, "OK", reply)

    async def reload(self) -> None:
        """What SIGHUP does: read the file and try it (the reloader's own loop is not run)."""
        token = OWNER.set(self.name)
        try:
            await self.reloader.check(forced=True)
        finally:
            OWNER.reset(token)

    async def stop(self) -> None:
        """SIGTERM: a graceful stop (the Lease released, creates in flight given their grace)."""
        if not self.dead:
            self.dead = True
            await self.provider.aclose()
            self.relay.sever()

    async def kill(self, loop: VirtualLoop) -> None:
        """SIGKILL: cut off from the Kubernetes API and the cloud first (nothing it does while
        dying reaches them), then every task of it cancelled, wherever it was."""
        if self.dead:
            return
        self.dead = True
        self.view.cut = True
        self.relay.sever()
        for _ in range(KILL_ROUNDS):
            tasks = loop.owned(self.name)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        else:
            alive = [t.get_coro() for t in loop.owned(self.name)]
            raise AssertionError(f"{self.name} would not die: tasks {alive} outlive cancelling")
        with contextlib.suppress(Exception):
            await self.engine.cloud.aclose()


async def start_replica(name: str, path: Path, view: KubeView, relay: Relay) -> Replica:
    """A replica serving the config at `path` (cloudscale.url through `relay`)."""
    token = OWNER.set(name)
    try:
        config = load_config(path)
        loop = asyncio.get_running_loop()

        async def link(config: Config, engine: Engine, metrics: Metrics) -> ClusterLink:
            return ClusterLink(config, engine, metrics, view, NAMESPACE, loop.time, name)  # type: ignore[arg-type]

        provider = await build_provider(config, clock=loop.time, link=link)
        engine = provider.service.engine

        async def online_check(candidate: Config) -> list[str]:
            return await online_problems(candidate.node_groups, engine.cloud)

        apply = reload_apply(provider, lambda: None)
        reloader = Reloader(ConfigFile.before_loading(path), config, online_check, apply)
        return Replica(name, path, view, relay, provider, servicer_of(provider), reloader)
    finally:
        OWNER.reset(token)
