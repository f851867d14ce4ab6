"""TCP that counts every byte it carries, after Noise and muxing: what the volunteer's network pays."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from libp2p.network.connection.raw_connection import RawConnection
from libp2p.transport.tcp.tcp import TCP


@dataclass
class Counters:
    """Bytes on the wire, written on the network thread and read from any other."""

    bytes_in: int = 0
    bytes_out: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, inbound: int = 0, outbound: int = 0) -> None:
        with self.lock:
            self.bytes_in += inbound
            self.bytes_out += outbound

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return self.bytes_in, self.bytes_out


class _CountingStream:
    """Wraps a TCP stream to count every byte read and written."""

    def __init__(self, inner, counters: Counters) -> None:
        self._inner, self._counters = inner, counters

    async def read(self, n: int | None = None) -> bytes:
        data = await self._inner.read(n)
        self._counters.add(inbound=len(data))
        return data

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)
        self._counters.add(outbound=len(data))

    def __getattr__(self, name):  # close, get_remote_address, …
        return getattr(self._inner, name)


class CountingTCP(TCP):
    """py-libp2p's TCP transport with every dialled and accepted stream counted."""

    def __init__(self, counters: Counters) -> None:
        super().__init__()
        self._counters = counters

    async def dial(self, maddr):
        conn = await super().dial(maddr)
        if isinstance(conn, RawConnection):
            conn.stream = _CountingStream(conn.stream, self._counters)
        return conn

    def create_listener(self, handler_function):
        counters = self._counters

        async def counted(stream):
            await handler_function(_CountingStream(stream, counters))

        return super().create_listener(counted)
