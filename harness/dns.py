"""A DNS server on loopback whose answers a test changes: a name that moves to a new address.

A gRPC target ``dns://127.0.0.1:<port>/<name>:<grpc port>`` makes gRPC's resolver ask this
server, not the system's, for ``name``: a test can then move a replica to another loopback
address (``127.0.0.2``) behind the same name, as a restarted pod gets a new IP behind its
DNS name, without touching the machine's resolver configuration.

Guarantees: an ``A`` query for a name in ``records`` is answered with its current address
and TTL 0; any other query (``AAAA``, another name) gets an answer with no records. Every
query is kept in ``queries`` with the monotonic time it arrived.

Non-guarantees: one question per query, no compression in questions, no TCP; enough for
gRPC's c-ares resolver, not a DNS implementation.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Final, cast

__all__ = ["DnsServer", "Query"]

_A: Final = 1
_IN: Final = 1
_HEADER: Final = struct.Struct(">HHHHHH")
_RESPONSE_FLAGS: Final = 0x8180
"""QR (a response), RD copied as set, RA: a plain recursive answer, NOERROR."""


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    qtype: int
    at: float
    """``time.monotonic()`` when it arrived."""


@dataclass
class DnsServer(asyncio.DatagramProtocol):
    """Answers ``A`` queries from ``records`` (name -> IPv4 address); see the module."""

    records: dict[str, str] = field(default_factory=dict)
    queries: list[Query] = field(default_factory=list)
    _transport: asyncio.DatagramTransport | None = None

    async def start(self, host: str = "127.0.0.1") -> int:
        """Listens on a UDP port of ``host`` the kernel picks; returns it."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host, 0))
        port: int = transport.get_extra_info("sockname")[1]
        return port

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # CPython's UDP transport has ``sendto`` without deriving from DatagramTransport.
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        parsed = _question(data)
        if parsed is None or self._transport is None:
            return
        qid, name, qtype, question = parsed
        self.queries.append(Query(name, qtype, time.monotonic()))
        address = self.records.get(name)
        answer = b""
        if qtype == _A and address is not None:
            # A pointer to the name in the question (offset 12), type A, class IN, TTL 0.
            answer = b"\xc0\x0c" + struct.pack(">HHIH", _A, _IN, 0, 4) + socket.inet_aton(address)
        header = _HEADER.pack(qid, _RESPONSE_FLAGS, 1, 1 if answer else 0, 0, 0)
        self._transport.sendto(header + question + answer, addr)


def _question(data: bytes) -> tuple[int, str, int, bytes] | None:
    """(id, name, type, the question's bytes) of a query; None if it is not one."""
    if len(data) < _HEADER.size:
        return None
    qid, _, count, _, _, _ = _HEADER.unpack_from(data)
    if count != 1:
        return None
    labels: list[str] = []
    i = _HEADER.size
    while i < len(data) and data[i]:
        n = data[i]
        labels.append(data[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    end = i + 1 + 4
    if end > len(data):
        return None
    (qtype,) = struct.unpack_from(">H", data, i + 1)
    return qid, ".".join(labels).lower(), qtype, data[_HEADER.size : end]
