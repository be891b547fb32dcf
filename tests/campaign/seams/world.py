"""The world a seams schedule runs in: one emulator for the whole test (reset per schedule), and
per schedule a Kubernetes API double, two replicas with their own config files and relays, the
config versions written, and what CA asked.

CA's calls go to the replica that serves (its gate open), as the gRPC Service's EndpointSlice
routes them; with none serving they fail as CA's would (no endpoint), and are not made.
"""

from __future__ import annotations

import asyncio
import copy
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from campaign.seams.clock import VirtualLoop
from campaign.seams.kubedouble import KubeDouble
from campaign.seams.relay import Relay
from campaign.seams.replica import NAMESPACE, Answer, Replica, start_replica
from cloudscale_autoscaler.cloud.emulator.server import Emulator
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import ConfigError

CLUSTER = "seams"
TOKEN = "seams-token"
REPLICAS = ("a", "b")
LEASE = "cas"
# CA's default per-RPC timeout (cloud-config grpc_timeout).
CA_DEADLINE = 5.0
# The cloud client's timeout T: a create of unknown outcome is counted for 2 T.
TIMEOUT_SECONDS = 5.0
# Never a legitimate answer: a crash leaking out, or an answer after CA gave up.
FORBIDDEN = frozenset({"INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED"})

Document = dict[str, Any]


def group(name: str, max_size: int, zone: str = "lpg1", **fields: Any) -> dict[str, Any]:
    return {"name": name, "minSize": 0, "maxSize": max_size, "flavor": "flex-4-2",
            "image": "debian-12", "zone": zone, **fields}  # fmt: skip


def base_document() -> Document:
    return {
        "cluster": CLUSTER,
        "tls": {"insecure": True},
        "cloudscale": {"timeoutSeconds": TIMEOUT_SECONDS, "maxConcurrentCreates": 2},
        "kubernetes": {
            "driftInterval": "0s",
            "leaderElection": {"enabled": True, "leaseName": LEASE, "namespace": NAMESPACE},
        },
        "nodeGroups": [group("workers", 4), group("batch", 3, "rma1", antiAffinity=True)],
    }


class ContractViolation(AssertionError):
    pass


@dataclass
class Schedule:
    """One schedule's world: made fresh per Hypothesis example."""

    vloop: VirtualLoop
    emulator: Emulator
    directory: Path
    double: KubeDouble = field(default_factory=KubeDouble)
    replicas: dict[str, Replica] = field(default_factory=dict)
    relays: dict[str, Relay] = field(default_factory=dict)
    documents: dict[str, Document] = field(default_factory=dict)
    # The largest maxSize each group had in any config a replica was given: no group ever
    # holds more servers (its own; others' made by hand are not the provider's).
    ceiling: dict[str, int] = field(default_factory=dict)
    # (group, server uuid) some DeleteNodes named; the API deleting anything else is a bug.
    requested: set[tuple[str, str]] = field(default_factory=set)
    manual: set[str] = field(default_factory=set)
    answers: int = 0
    unrouted: int = 0  # calls CA could not make: no replica served

    # --- life ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Both replicas running, one of them serving."""
        random.seed(0)  # every schedule draws the same jitter: a failing one replays
        for name in REPLICAS:
            relay = Relay("127.0.0.1", _port(self.emulator.url))
            await relay.start()
            self.relays[name] = relay
            self.write(name, base_document())
            await self.spawn(name)
        for _ in range(120):  # a minute of virtual time
            if self.leader() is not None:
                return
            await asyncio.sleep(0.5)
        raise AssertionError("no replica came to serve after the start")

    async def spawn(self, name: str) -> bool:
        """Start replica `name` on its file (a new process: nothing of the old one kept);
        False when the file is one `serve` refuses (it stays down, as a Pod in CrashLoop)."""
        if name in self.replicas and not self.replicas[name].dead:
            return True
        relay = self.relays[name]
        relay.mend()
        try:
            replica = await start_replica(name, self.path(name), self.double.view(name), relay)
        except ConfigError:
            return False
        self.replicas[name] = replica
        return True

    async def close(self) -> None:
        for replica in self.replicas.values():
            await replica.kill(self.vloop)
        for relay in self.relays.values():
            relay.close()

    # --- config files -------------------------------------------------------------------

    def path(self, name: str) -> Path:
        return self.directory / name / "config.yaml"

    def write(self, name: str, document: Document | str) -> None:
        """Replica `name`'s config file from now on (read at its next start or reload)."""
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "token").write_text(TOKEN + "\n")
        (path.parent / "token").chmod(0o600)
        if isinstance(document, str):
            path.write_text(document)
            return
        document = copy.deepcopy(document)
        self.documents[name] = document
        written = copy.deepcopy(document)
        written["cloudscale"] = {**written["cloudscale"], "url": self.relays[name].url,
                                 "tokenFile": str(path.parent / "token")}  # fmt: skip
        path.write_text(yaml.safe_dump(written, sort_keys=False))
        for entry in document.get("nodeGroups") or []:
            if isinstance(entry, dict) and isinstance(entry.get("maxSize"), int):
                for name_ in _names(entry):
                    self.ceiling[name_] = max(self.ceiling.get(name_, 0), entry["maxSize"])

    # --- CA -----------------------------------------------------------------------------

    def leaders(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.serving]

    def leader(self) -> Replica | None:
        serving = self.leaders()
        return serving[0] if len(serving) == 1 else None

    async def ca(self, rpc: str, request: Any, allowed: tuple[str, ...] = ()) -> Answer | None:
        """CA's call through the Service to the replica serving; None when none serves."""
        replica = self.leader()
        if replica is None:
            self.unrouted += 1
            return None
        answer = await replica.call(rpc, request, CA_DEADLINE)
        self.answers += 1
        if answer.code in FORBIDDEN or not (answer.ok or answer.code in allowed):
            raise ContractViolation(
                f"{replica.name}: {rpc}({_short(request)}) answered {answer.code}: "
                f"{answer.details!r}; expected OK or one of {list(allowed)}"
            )
        return answer

    async def wait(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass (renewals, expiries, creates at the API)."""
        await asyncio.sleep(seconds)


def _names(entry: dict[str, Any]) -> list[str]:
    zones = entry.get("zones")
    if isinstance(zones, list):
        return [f"{entry.get('name')}-{zone}" for zone in zones]
    return [str(entry.get("name"))]


def _port(url: str) -> int:
    return int(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def _short(request: Any) -> str:
    text = str(request).replace("\n", " ").strip()
    return text if len(text) < 200 else text[:200] + "..."


def target_request(name: str) -> pb.NodeGroupTargetSizeRequest:
    return pb.NodeGroupTargetSizeRequest(id=name)
