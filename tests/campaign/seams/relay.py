"""A replica's road to the cloud API: a TCP relay on loopback to the emulator that the
campaign can cut (the replica's connections dropped, new ones refused, as for a replica cut off
from the network) and mend. A killed replica's relay is closed for good."""

from __future__ import annotations

import asyncio
import contextlib


class Relay:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        self.cut = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, upstream_writer}
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            self._writers -= {writer, upstream_writer}

    def sever(self) -> None:
        """Drop every connection and refuse new ones until `mend`."""
        self.cut = True
        for writer in list(self._writers):
            writer.transport.abort()

    def mend(self) -> None:
        self.cut = False

    def close(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    sink.close()
