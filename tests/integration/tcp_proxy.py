"""A TCP proxy on loopback that a test can cut and heal: a partition between a gateway and
a replica that stays in place (same process, same owner, same epoch).

While cut, every open connection is closed and a new one is closed as soon as it is
accepted, so the client sees ``UNAVAILABLE`` at once; healed, connections pass again.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` (``host:port``)."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.is_cut = False

    async def start(self) -> str:
        """Starts listening; returns the proxy's address."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    def cut(self) -> None:
        """Closes every connection and refuses new ones until ``heal``."""
        self.is_cut = True
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def heal(self) -> None:
        """Lets connections through again."""
        self.is_cut = False

    async def close(self) -> None:
        """Stops listening and closes every connection."""
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(
                self._pipe(source, sink, writer, up_writer)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        *ends: asyncio.StreamWriter,
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                if self.is_cut:
                    break
                sink.write(data)
                await sink.drain()
        for end in ends:
            end.close()
            self._writers.discard(end)
