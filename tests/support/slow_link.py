"""A TCP link to a real server that delivers every answer a fixed time late.

Why it exists: a test of how a client copes with a slow server (a Redis across a busy
network, say) should not depend on how loaded this machine happens to be. Put the real
server behind a :class:`SlowLink` and its answers arrive exactly ``delay`` seconds after
the server sent them (in order, per connection); requests go through at once. The delay is
scheduled on the event loop (``call_at``), so nothing in the test sleeps.

    async with SlowLink("127.0.0.1", redis.port, delay=0.05) as link:
        store = RedisBudgetStore(link.url)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class SlowLink:
    """A local TCP proxy to ``host:port`` that delays each answer by ``delay`` seconds."""

    def __init__(self, host: str, port: int, delay: float) -> None:
        self.host, self.port, self.delay = host, port, delay
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.listen_port = 0

    @property
    def url(self) -> str:
        """``redis://`` URL of the link's end (for a Redis behind it)."""
        return f"redis://127.0.0.1:{self.listen_port}/0"

    async def __aenter__(self) -> SlowLink:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        for writer in self._writers:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await writer.wait_closed()
        if self._server is not None:
            await self._server.wait_closed()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self._writers |= {writer, up_writer}
        for pump in (self._pump(reader, up_writer, 0.0), self._pump(up_reader, writer, self.delay)):
            task = asyncio.create_task(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float
    ) -> None:
        loop = asyncio.get_running_loop()
        due: deque[tuple[float, bytes]] = deque()  # in arrival order

        def deliver(everything: bool = False) -> None:  # each chunk whose time came, in order
            while due and (everything or due[0][0] <= loop.time()):
                data = due.popleft()[1]
                with contextlib.suppress(RuntimeError, ConnectionError):
                    if not writer.is_closing():
                        writer.write(data)

        try:
            while data := await reader.read(65536):
                if delay:
                    due.append((loop.time() + delay, data))
                    loop.call_at(due[-1][0], deliver)
                else:
                    writer.write(data)
        finally:  # the end of the stream, as late as its last chunk

            def end() -> None:
                deliver(everything=True)
                writer.close()

            loop.call_at(loop.time() + delay, end)
