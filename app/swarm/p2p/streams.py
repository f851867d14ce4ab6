"""Stream helpers every protocol here uses: reading a libp2p stream (which hands back partial
chunks and an empty read at its end), hanging one up, and whom it comes from.

Plain duck-typed calls on py-libp2p's stream objects (`read`, `reset`, `muxed_conn`): no import of
the library, and no protocol's rules (each protocol sets its own limits and deadlines).
"""

from __future__ import annotations


async def read_exact(stream, n: int) -> bytes:
    """libp2p streams return partial chunks: read until n bytes or EOF (an error)."""
    parts, got = [], 0
    while got < n:
        chunk = await stream.read(n - got)
        if not chunk:
            raise EOFError(f"stream ended after {got} of {n} bytes")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


async def read_line(stream, limit: int) -> bytes:
    """One line, without its newline; ValueError past `limit` bytes, EOFError if the stream ends first."""
    data = b""
    while not data.endswith(b"\n"):
        if len(data) >= limit:
            raise ValueError("request line too long")
        chunk = await stream.read(1)
        if not chunk:
            raise EOFError("request ended early")
        data += chunk
    return data[:-1]


async def reset_quietly(stream) -> None:
    try:
        await stream.reset()
    except Exception:  # noqa: BLE001 — already closed or gone
        pass


def remote_peer(stream) -> str:
    """The peer id at the other end ("?" when the stream does not say)."""
    try:
        return stream.muxed_conn.peer_id.to_base58()
    except AttributeError:
        return "?"


def remote_ip(stream) -> str | None:
    """The IP address the stream's connection comes from; None when relayed or unknown."""
    try:
        addrs = [str(a) for a in stream.muxed_conn.get_transport_addresses()]
    except Exception:  # noqa: BLE001
        return None
    for addr in addrs:
        parts = addr.split("/")
        if "p2p-circuit" in parts:
            return None
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            return parts[2]
    return None
