"""Loopback ports for the processes the harness starts.

``free_port`` gives a port that was free a moment ago, chosen below the kernel's range of
ephemeral ports: the outgoing connections of every process on the machine (etcd's peers,
gRPC channels, the suite's own clients) take their local ports from that range, and a
server started a second later on a port from it could find it taken by one of them. Below
the range only another server that binds the same number explicitly can take it, and
this process never hands out a port twice. It is still not a reservation: a caller that
starts a server on it must be ready to retry (as ``EtcdProcess.start`` does) or to fail
with a clear message. ``listens`` tells whether a given process holds the listening socket
of a port, to catch the loser of such a race.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"

_LOWEST_PORT = 10_000
"""The lowest port handed out: well above the ports of common services."""
_PICKS = 200
"""Ports tried below the ephemeral range before falling back to one the kernel picks."""
_handed_out: set[int] = set()
_random = random.Random(os.getpid() ^ time.monotonic_ns())


def _ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range when
    there is room there, never the same twice in one process."""
    floor = _ephemeral_floor()
    if floor - _LOWEST_PORT > 2 * _PICKS:
        for _ in range(_PICKS):
            port = _random.randrange(_LOWEST_PORT, floor)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the listening socket of 127.0.0.1:``port``.

    A server that lost the race for a port ``free_port`` gave it exits a moment later; until
    then a request to that port is answered by whichever process holds it, and a test would
    go on against the wrong server. Off Linux, where /proc is not there, this cannot be told
    and is taken as true.
    """
    fds = Path("/proc", str(pid), "fd")
    tcp = Path("/proc", "net", "tcp")
    if not fds.is_dir() or not tcp.is_file():
        return True
    inodes = set()
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    for line in tcp.read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
            return True  # 0A: LISTEN
    return False
