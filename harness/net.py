"""Loopback ports for the processes the harness starts.

``free_port`` gives a port that was free a moment ago: another process may take it before
the caller binds it, so a caller that starts a server on it must be ready to retry (as
``EtcdProcess.start`` does) or to fail with a clear message. ``listens`` tells whether a
given process holds the listening socket of a port, to catch the loser of such a race.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


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
