"""A TCP proxy on loopback that a test can cut and heal: a partition that leaves every
process in place (same process, same owner, same epoch).

One proxy serves every partition the tests and drills make: between a gateway and a
replica, and between etcd members (each member's peer URL behind one, see
``harness.etcd_cluster``, which cuts the connections of chosen members only).

It runs on threads, not on the test's event loop: a test that blocks its loop for a moment
(a subprocess wait) must not stall what goes through it (etcd's heartbeats).

Every connection is relayed byte for byte. Given ``origin_of``, the proxy first reads the
header of the connection's first request (up to its blank line) and asks ``origin_of`` who
sent it; ``cut(origins=...)`` then cuts the connections of those senders only. Without
``origin_of``, connections have no origin and bytes flow from the first one.

Guarantees: a cut connection is closed in both directions before ``cut`` returns, and no
byte reaches either end on it afterwards; while cut, a new connection is closed as soon as
it is accepted (its header read, for a cut of some origins), so a client sees the other end
gone at once; after ``heal`` new connections pass again. Not guaranteed: timing (a relay
adds a thread hop per chunk).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable

from harness.net import LOOPBACK

HEADER_LIMIT = 16 * 1024
"""The most the proxy reads of a connection's first request to find its origin."""

OriginOf = Callable[[bytes], str | None]
"""Who sent a connection, from the header of its first request (None: unknown)."""


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` (a free port) to ``upstream`` (``host:port``).

    Args:
        upstream: where connections go.
        name: names the proxy's threads.
        origin_of: tells a connection's sender from its first request's header, for
            ``cut(origins=...)``; connections have no origin without it.
    """

    def __init__(
        self, upstream: str, *, name: str = "tcp-proxy", origin_of: OriginOf | None = None
    ) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.name = name
        self._origin_of = origin_of
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((LOOPBACK, 0))
        self._server.listen(64)
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._cut_all = False
        self._cut_from: set[str] = set()
        self._conns: list[tuple[str | None, socket.socket, socket.socket]] = []
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        """``host:port`` to connect to instead of the upstream."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def cut(self, *, origins: Iterable[str] | None = None) -> None:
        """Closes the connections from ``origins`` (as ``origin_of`` names them, compared
        without case), or every connection when None, and refuses theirs until ``heal``."""
        with self._lock:
            if origins is None:
                self._cut_all = True
            else:
                self._cut_from |= {o.lower() for o in origins}
            victims = [c for c in self._conns if self._is_cut(c[0])]
        for _, downstream, upstream in victims:
            _shut(downstream)
            _shut(upstream)

    def heal(self) -> None:
        """Lets every connection through again."""
        with self._lock:
            self._cut_all = False
            self._cut_from.clear()

    def close(self) -> None:
        """Stops listening and closes every connection."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        _shut(self._server)
        self._server.close()
        for _, downstream, upstream in conns:
            _shut(downstream)
            _shut(upstream)
        self._acceptor.join(timeout=2.0)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _is_cut(self, origin: str | None) -> bool:
        return self._cut_all or (origin is not None and origin in self._cut_from)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._server.accept()
            except OSError:
                return
            if self._cut_all:
                _close(downstream)
                continue
            threading.Thread(
                target=self._serve, args=(downstream,), name=f"{self.name}-conn", daemon=True
            ).start()

    def _read_head(self, downstream: socket.socket) -> bytes:
        """The first request's header, when the proxy needs an origin; b"" otherwise."""
        head = b""
        if self._origin_of is None:
            return head
        downstream.settimeout(5.0)
        while b"\r\n\r\n" not in head and len(head) < HEADER_LIMIT:
            chunk = downstream.recv(4096)
            if not chunk:
                break
            head += chunk
        return head

    def _serve(self, downstream: socket.socket) -> None:
        try:
            head = self._read_head(downstream)
            upstream = socket.create_connection(self.upstream, timeout=2.0)
        except OSError:
            _close(downstream)
            return
        downstream.settimeout(None)
        upstream.settimeout(None)
        origin = None if self._origin_of is None else self._origin_of(head)
        entry = (origin, downstream, upstream)
        with self._lock:
            refused = self._closed or self._is_cut(origin)
            if not refused:
                self._conns.append(entry)
        if refused:
            _close(downstream)
            _close(upstream)
            return
        try:
            if head:
                upstream.sendall(head)
            back = threading.Thread(
                target=_pump, args=(upstream, downstream), name=f"{self.name}-back", daemon=True
            )
            back.start()
            _pump(downstream, upstream)
            back.join(timeout=5.0)
        except OSError:
            pass
        finally:
            with self._lock:
                if entry in self._conns:
                    self._conns.remove(entry)
            _close(downstream)
            _close(upstream)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copies ``source`` to ``sink`` until either side ends; then ends both."""
    try:
        while True:
            chunk = source.recv(65536)
            if not chunk:
                break
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        _shut(source)
        _shut(sink)


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)


def _close(s: socket.socket) -> None:
    _shut(s)
    s.close()
