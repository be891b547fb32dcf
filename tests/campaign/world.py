"""The world a synchronous Hypothesis test drives: one emulator and one PKI for the whole
test, and the REAL provider (app wiring, engine, service, mTLS transport) restarted per example.

Per-example cost is kept low by reusing the emulator (POST /_emulator/reset) and starting a
fresh in-process provider rather than new processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from fixtures.emulator import TOKEN, EmulatorAdmin, RunningEmulator
from fixtures.stack import Stack, stack_config, start_stack
from fixtures.tls import PKI, make_pki

from campaign.loop import LoopThread
from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig

T = TypeVar("T")

# CA's default per-RPC timeout (cloud-config grpc_timeout): every call of ours uses it.
CA_DEADLINE_SECONDS = 5.0
# Never a legitimate answer to a well-formed or malformed request: a crash or a missed deadline.
FORBIDDEN_CODES = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}
)


@dataclass(frozen=True)
class Outcome:
    """What one RPC answered: the status code, the reply (OK only) and the error details."""

    rpc: str
    code: grpc.StatusCode
    reply: Any = None
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK


class ContractViolation(AssertionError):
    pass


async def call(
    rpc: str,
    method: Callable[..., Awaitable[Any]],
    request: Any,
    allowed: Sequence[grpc.StatusCode] = (),
    deadline: float = CA_DEADLINE_SECONDS,
) -> Outcome:
    """Call `method` under CA's deadline; returns OK or an error code from `allowed`.

    Anything else fails: DEADLINE_EXCEEDED (CA gives up after its timeout, so an answer that
    late is no answer), INTERNAL/UNKNOWN (a crash leaking out), or an unexpected code.
    """
    try:
        reply = await method(request, timeout=deadline)
    except grpc.aio.AioRpcError as error:
        outcome = Outcome(rpc, error.code(), None, error.details() or "")
    else:
        return Outcome(rpc, grpc.StatusCode.OK, reply)
    if outcome.code in FORBIDDEN_CODES or outcome.code not in allowed:
        raise ContractViolation(
            f"{rpc}({_show(request)}) answered {outcome.code.name}: {outcome.details!r}; "
            f"expected OK or one of {[c.name for c in allowed]}"
        )
    return outcome


def _show(request: Any) -> str:
    text = str(request).replace("\n", " ").strip()
    return text if len(text) < 300 else text[:300] + "..."


@dataclass
class World:
    runner: LoopThread
    emulator: RunningEmulator
    pki: PKI
    stack: Stack | None = None
    registry: list[Stack] = field(default_factory=list)

    def __repr__(self) -> str:  # Hypothesis prints fixtures in failure reports: keep it short
        return f"World(emulator={self.emulator.url})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    @property
    def admin(self) -> EmulatorAdmin:
        return self.emulator.admin

    def run(self, coro: Awaitable[T], limit: float | None = None) -> T:
        if limit is None:
            return self.runner.run(coro)  # type: ignore[arg-type]
        return self.runner.run(coro, limit)  # type: ignore[arg-type]

    async def fresh_stack(self, groups: Sequence[NodeGroupConfig], **fields: Any) -> Stack:
        """Stop the current provider, reset the cloud, start a new provider on it."""
        await self.admin.clear_faults()  # releases requests held by an injected latency
        await self.stop_stack()
        await self.admin.reset()
        config = stack_config(self.emulator, self.pki, groups, **fields)
        return await self.start_stack(config)

    async def start_stack(self, config: Config) -> Stack:
        self.stack = await start_stack(config, self.emulator, self.pki, self.registry)
        return self.stack

    async def restart(self) -> Stack:
        """A new provider instance (client, engine, server) on the same cloud and config."""
        assert self.stack is not None
        self.stack = await self.stack.restart()
        return self.stack

    async def stop_stack(self) -> None:
        for running in self.registry:
            await running.stop()
        self.registry.clear()
        self.stack = None


async def _start_emulator(seed: int) -> RunningEmulator:
    emu = RunningEmulator(token=TOKEN, seed=seed, boot_seconds=0.0)
    await emu.start("127.0.0.1", 0)
    emu.admin = EmulatorAdmin(emu.admin_url)
    return emu


async def _stop_emulator(emu: RunningEmulator) -> None:
    await emu.admin.aclose()
    await emu.stop()


@contextlib.contextmanager
def world(directory: Path, seed: int = 0) -> Iterator[World]:
    """A running world for the duration of the `with` (one per test, not per example)."""
    runner = LoopThread()
    try:
        emulator = runner.run(_start_emulator(seed))
        current = World(runner, emulator, make_pki(directory / "pki"))
        try:
            yield current
        finally:
            runner.run(current.stop_stack())
            runner.run(_stop_emulator(emulator))
    finally:
        runner.close()
