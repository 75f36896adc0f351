"""Real etcd on loopback, for integration tests and failover drills.

``EtcdProcess`` owns one ``etcd`` child process, its data dir and its two ports (client
and peer). It can stop, kill, pause (SIGSTOP), resume (SIGCONT) and restart the member on
the same data dir and ports, so a test sees what a client sees when its etcd goes away
and comes back with the same data.

A single member runs with a 50 ms heartbeat and a 500 ms election timeout, which lowers
etcd's minimum lease TTL to 1 s (with the defaults a 1 s lease is granted 2 s).

``EtcdCluster`` runs three members as one cluster (100 ms heartbeat, 1 s election timeout,
so that a loaded test machine does not elect a new leader by accident), each member's peer
URL behind a ``PeerProxy`` in this process, so that a test can cut one member off from its
peers while its client URL keeps serving. It finds the leader and moves leadership with
``etcdctl``. Every wait is bounded; ``close`` stops every member and proxy.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import IO

_MISSING_HINT = (
    "the etcd binary was not found on PATH: run `make test`, which installs "
    "Debian's etcd-server (etcd 3.4) before running the tests"
)


_LIVE: weakref.WeakSet[EtcdProcess] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    """A safety net for a test run that ends without its fixtures' teardown."""
    for etcd in list(_LIVE):
        with contextlib.suppress(Exception):
            etcd.close()


class EtcdNotInstalled(RuntimeError):
    """No ``etcd`` binary on this machine."""


def find_etcd() -> str:
    """The etcd binary: on PATH, else in the system directories Debian installs into.

    Raises:
        EtcdNotInstalled: with the command that installs it.
    """
    found = shutil.which("etcd") or shutil.which("etcd", path="/usr/sbin:/usr/bin")
    if found is None:
        raise EtcdNotInstalled(_MISSING_HINT)
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the listening socket of 127.0.0.1:``port``.

    A member that lost the race for a port free_port() gave it exits a moment later; until
    then its health URL is answered by whichever process holds that port (another test's
    etcd), and a test would go on against the wrong etcd. Off Linux, where /proc is not
    there, this cannot be told and is taken as true.
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


def _wait_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Waits until every thread of ``pid`` is in the stopped state (``T``); off Linux,
    where /proc is not there, returns at once."""
    tasks = Path("/proc", str(pid), "task")
    if not tasks.is_dir():
        return
    deadline = time.monotonic() + timeout_s
    while True:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):
                stat = (task / "stat").read_text()
                states.append(stat[stat.rindex(")") + 2])
        if states and all(state in "Tt" for state in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not stop within {timeout_s}s: {states}")
        time.sleep(0.001)


def _fast_tmp_root() -> str | None:
    """A RAM-backed directory when the machine has one: etcd fsyncs every write."""
    shm = Path(os.sep, "dev", "shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return None


class EtcdProcess:
    """One etcd member on 127.0.0.1 with its own data dir and free ports.

    Args:
        name: the member name (also part of the data dir name).
        base_dir: where to create the data dir; a RAM-backed temp dir by default.
        start_timeout_s: how long ``start`` waits for the member to answer.
        peer_url: the peer URL the member advertises (a proxy's, in a cluster); its own
            listening peer URL by default.
        initial_cluster: etcd's ``--initial-cluster``; this member alone by default.
        cluster_token: etcd's ``--initial-cluster-token``.
        heartbeat_ms: etcd's ``--heartbeat-interval``.
        election_ms: etcd's ``--election-timeout``.
    """

    def __init__(
        self,
        *,
        name: str = "test-etcd",
        base_dir: Path | None = None,
        start_timeout_s: float = 20.0,
        peer_url: str | None = None,
        initial_cluster: str | None = None,
        cluster_token: str | None = None,
        heartbeat_ms: int = 50,
        election_ms: int = 500,
    ) -> None:
        self.binary = find_etcd()
        self.name = name
        self.start_timeout_s = start_timeout_s
        self._own_dir = base_dir is None
        root = Path(tempfile.mkdtemp(prefix="fairshare-etcd-", dir=_fast_tmp_root()))
        self.dir = root if base_dir is None else Path(base_dir)
        if base_dir is not None:
            shutil.rmtree(root, ignore_errors=True)
            self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.dir / f"{name}.etcd"
        self.log_path = self.dir / f"{name}.log"
        self.client_port = free_port()
        self.peer_port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started_once = False
        self._peer_url = peer_url
        self._initial_cluster = initial_cluster
        self._cluster_token = cluster_token
        self._heartbeat_ms = heartbeat_ms
        self._election_ms = election_ms

    # -- addresses ----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client URL."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def endpoints(self) -> list[str]:
        """Every client endpoint (one member)."""
        return [self.endpoint]

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Starts the member (on the same data dir and ports as before, after a stop) and
        waits until it answers a health check."""
        if self.running:
            raise RuntimeError(f"etcd {self.name} is already running (pid {self.pid})")
        attempts = 1 if self._started_once else 3
        for attempt in range(1, attempts + 1):
            self._spawn()
            try:
                self._wait_healthy()
            except RuntimeError:
                self.kill()
                if attempt == attempts:
                    raise
                # The ports may have been taken between free_port() and the bind.
                self.client_port, self.peer_port = free_port(), free_port()
                shutil.rmtree(self.data_dir, ignore_errors=True)
                continue
            self._started_once = True
            return

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the member has not exited within ``timeout_s``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            # A paused member cannot act on SIGTERM until it runs again.
            proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        self._reap()

    def kill(self) -> None:
        """SIGKILL: the member dies at once, as in a crash."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        self._reap()

    def pause(self) -> None:
        """SIGSTOP: the member keeps its sockets open but answers nothing. Returns once
        every thread of the process is stopped (Linux), so a call sent next is not
        answered by a thread that had yet to stop."""
        self._signal(signal.SIGSTOP)
        assert self._proc is not None
        _wait_stopped(self._proc.pid)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        self._signal(signal.SIGCONT)

    def restart(self) -> None:
        """Stops the member and starts it again on the same data dir and ports."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stops the member and deletes its directory."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 30) -> str:
        """The end of the member's log, for failure messages."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- internals ----------------------------------------------------------------------

    @property
    def listen_peer_url(self) -> str:
        """The URL the member's peer listener binds (behind the proxy, in a cluster)."""
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def peer_url(self) -> str:
        """The peer URL the member advertises to its peers."""
        return self._peer_url or self.listen_peer_url

    def spawn(self) -> None:
        """Starts the process without waiting (a cluster member waits for its quorum)."""
        if self.running:
            raise RuntimeError(f"etcd {self.name} is already running (pid {self.pid})")
        self._spawn()

    def wait_healthy(self) -> None:
        """Waits until the member answers a health check.

        Raises:
            RuntimeError: it exited, or did not answer within ``start_timeout_s``.
        """
        self._wait_healthy()
        self._started_once = True

    def _spawn(self) -> None:
        peer_url = self.peer_url
        args = [
            self.binary,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.client_url,
            "--advertise-client-urls",
            self.client_url,
            "--listen-peer-urls",
            self.listen_peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            self._initial_cluster or f"{self.name}={peer_url}",
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            self._cluster_token or f"{self.name}-{self.client_port}",
            "--heartbeat-interval",
            str(self._heartbeat_ms),
            "--election-timeout",
            str(self._election_ms),
            # A member that comes back from a partition must not depose the leader the
            # others kept meanwhile (etcd 3.5's default; 3.4 needs the flag).
            "--pre-vote",
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ]
        self._log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        _LIVE.add(self)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise RuntimeError(f"etcd exited with {code} at start:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.client_url}/health", timeout=1) as resp:
                    doc = json.loads(resp.read())
                if doc.get("health") == "true" and _listens(proc.pid, self.client_port):
                    return
                last = f"health answer {doc}"
            except (OSError, urllib.error.URLError, ValueError) as e:
                last = repr(e)
            time.sleep(0.05)
        raise RuntimeError(
            f"etcd did not answer within {self.start_timeout_s} s (last: {last}):\n"
            f"{self.log_tail()}"
        )

    def _signal(self, sig: signal.Signals) -> None:
        if not self.running:
            raise RuntimeError(f"etcd {self.name} is not running")
        assert self._proc is not None
        self._proc.send_signal(sig)

    def _reap(self) -> None:
        self._proc = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None


# -- a three-member cluster -----------------------------------------------------------------

_FROM_HEADER = b"x-server-from:"
_HEADER_LIMIT = 16 * 1024


def _origin_of(head: bytes) -> str | None:
    """The sending member's id (hex) in an etcd peer request, from ``X-Server-From``.

    etcd 3.4 sets this header on every raft stream, pipeline and snapshot request; other
    peer requests (version, members) have none and are not raft traffic.
    """
    for line in head.split(b"\r\n"):
        if line.lower().startswith(_FROM_HEADER):
            return line[len(_FROM_HEADER) :].strip().decode("ascii", "replace").lower()
    return None


class PeerProxy:
    """A TCP relay on 127.0.0.1 in front of one member's peer listener, on threads.

    Threads, not the test's event loop: a test that blocks its loop for a moment (a
    subprocess wait) must not stall the cluster's heartbeats.

    Every connection is relayed byte for byte after its first request's header is read,
    which names the sending member. ``block`` drops (and from then on refuses) the
    connections that come from a set of members, or all of them; ``unblock`` lets new
    connections through again. Guarantees: a blocked connection is closed within one
    ``block`` call; no byte reaches the member on it afterwards. Not a guarantee: timing
    (a relay adds a thread hop per chunk).
    """

    def __init__(self, *, name: str, target_port: int) -> None:
        self.name = name
        self.target_port = target_port
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._blocked_all = False
        self._blocked_from: set[str] = set()
        self._conns: list[tuple[str | None, socket.socket, socket.socket]] = []
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"peer-proxy-{name}", daemon=True
        )
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def block(self, *, origins: set[str] | None = None) -> None:
        """Drops the connections from ``origins`` (member ids, hex), or all when None."""
        with self._lock:
            if origins is None:
                self._blocked_all = True
            else:
                self._blocked_from |= {o.lower() for o in origins}
            victims = [c for c in self._conns if self._is_blocked(c[0])]
        for _, downstream, upstream in victims:
            _shut(downstream)
            _shut(upstream)

    def unblock(self) -> None:
        with self._lock:
            self._blocked_all = False
            self._blocked_from.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        _shut(self._server)
        self._server.close()
        for _, downstream, upstream in conns:
            _shut(downstream)
            _shut(upstream)
        self._acceptor.join(timeout=2.0)

    def _is_blocked(self, origin: str | None) -> bool:
        return self._blocked_all or (origin is not None and origin in self._blocked_from)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve,
                args=(downstream,),
                name=f"peer-proxy-{self.name}-conn",
                daemon=True,
            ).start()

    def _serve(self, downstream: socket.socket) -> None:
        head = b""
        downstream.settimeout(5.0)
        try:
            while b"\r\n\r\n" not in head and len(head) < _HEADER_LIMIT:
                chunk = downstream.recv(4096)
                if not chunk:
                    break
                head += chunk
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2.0)
        except OSError:
            _shut(downstream)
            downstream.close()
            return
        downstream.settimeout(None)
        upstream.settimeout(None)
        origin = _origin_of(head)
        entry = (origin, downstream, upstream)
        with self._lock:
            refused = self._closed or self._is_blocked(origin)
            if not refused:
                self._conns.append(entry)
        if refused:
            for s in (downstream, upstream):
                _shut(s)
                s.close()
            return
        try:
            upstream.sendall(head)
            back = threading.Thread(
                target=_pump,
                args=(upstream, downstream),
                name=f"peer-proxy-{self.name}-back",
                daemon=True,
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
            for s in (downstream, upstream):
                _shut(s)
                s.close()


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


def find_etcdctl() -> str:
    """The etcdctl binary (Debian's etcd-client), for leader queries and moves."""
    found = shutil.which("etcdctl") or shutil.which("etcdctl", path="/usr/sbin:/usr/bin")
    if found is None:
        raise EtcdNotInstalled(
            "etcdctl was not found on PATH: run `make etcd`, which installs Debian's "
            "etcd-client with etcd-server"
        )
    return found


CLUSTER_HEARTBEAT_MS = 100
CLUSTER_ELECTION_MS = 1000


class EtcdCluster:
    """Three etcd members on 127.0.0.1, each advertising its peer URL through a ``PeerProxy``.

    Members are named ``<name>-0`` … ``<name>-2``; ``members[i]`` serves ``endpoints[i]``.
    ``pause``/``resume``/``kill`` without a member act on all of them, as a single
    ``EtcdProcess`` does, so a drill written for one member runs against the cluster.

    Args:
        name: prefix of the member names and of the cluster token.
        base_dir: where the members' data dirs go; a RAM-backed temp dir by default.
        size: the number of members (3 by default).
        start_timeout_s: how long ``start`` waits for every member to be healthy.
    """

    def __init__(
        self,
        *,
        name: str = "test-cluster",
        base_dir: Path | None = None,
        size: int = 3,
        start_timeout_s: float = 20.0,
    ) -> None:
        self.name = name
        self.size = size
        self.start_timeout_s = start_timeout_s
        self._own_dir = base_dir is None
        self.dir = (
            Path(tempfile.mkdtemp(prefix="fairshare-etcd-cluster-", dir=_fast_tmp_root()))
            if base_dir is None
            else Path(base_dir)
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.etcdctl = find_etcdctl()
        self.members: list[EtcdProcess] = []
        self.proxies: list[PeerProxy] = []
        self._ids: dict[str, str] = {}  # member name -> id (hex)
        _LIVE_CLUSTERS.add(self)

    # -- addresses ----------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        """Every member's client endpoint, in member order."""
        return [m.endpoint for m in self.members]

    @property
    def endpoint(self) -> str:
        """A comma-separated list of every client endpoint (what ``--etcd`` takes)."""
        return ",".join(self.endpoints)

    @property
    def running(self) -> bool:
        return bool(self.members) and all(m.running for m in self.members)

    def member(self, name_or_index: str | int) -> EtcdProcess:
        if isinstance(name_or_index, int):
            return self.members[name_or_index]
        return next(m for m in self.members if m.name == name_or_index)

    def member_id(self, name: str) -> str:
        """The member's raft id (hex, as etcd prints it)."""
        return self._ids[name]

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Starts every member (retrying once on fresh ports if a port was taken) and
        waits until all are healthy and agree on one leader."""
        for attempt in (1, 2):
            self._build()
            for m in self.members:
                m.spawn()
            try:
                for m in self.members:
                    m.wait_healthy()
                self._ids = self._read_ids()
                self.leader(timeout_s=self.start_timeout_s)
                return
            except RuntimeError:
                self._teardown()
                if attempt == 2:
                    raise

    def close(self) -> None:
        """Stops every member and proxy and deletes the data (also after a failure)."""
        self._teardown()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pause(self, member: str | None = None) -> None:
        """SIGSTOP one member, or all of them."""
        for m in self._pick(member):
            m.pause()

    def resume(self, member: str | None = None) -> None:
        """SIGCONT one member, or all of them."""
        for m in self._pick(member):
            m.resume()

    def kill(self, member: str | None = None) -> None:
        """SIGKILL one member, or all of them."""
        for m in self._pick(member):
            m.kill()

    def stop(self, member: str | None = None) -> None:
        for m in self._pick(member):
            m.stop()

    def restart(self) -> None:
        """Stops every member and starts them all again on their data dirs and ports (an
        etcd restart under load); returns once they are healthy and agree on a leader."""
        for m in self.members:
            m.stop()
        for m in self.members:
            m.spawn()
        for m in self.members:
            m.wait_healthy()
        self.leader(timeout_s=self.start_timeout_s)

    def restart_member(self, member: str) -> None:
        """Starts a stopped or killed member again on its data dir and ports, and waits
        until it is healthy (it rejoins the cluster)."""
        self.member(member).start()

    def isolate(self, member: str) -> None:
        """Cuts every peer connection to and from ``member``; its client URL keeps serving.

        Its peers then elect (or keep) a leader without it; the member itself has none.
        """
        index = self.members.index(self.member(member))
        self.proxies[index].block()
        for i, proxy in enumerate(self.proxies):
            if i != index:
                proxy.block(origins={self._ids[member]})

    def heal(self) -> None:
        """Lets every peer connection through again."""
        for proxy in self.proxies:
            proxy.unblock()

    # -- leadership -------------------------------------------------------------------------

    def status(self, member: str) -> dict[str, object]:
        """``etcdctl endpoint status`` of one member (its JSON ``Status``)."""
        out = self._etcdctl(self.member(member).endpoint, "endpoint", "status", "-w", "json")
        doc = json.loads(out)
        status = doc[0]["Status"]
        assert isinstance(status, dict)
        return status

    def leader(self, *, timeout_s: float = 10.0) -> str:
        """The name of the running member that every running member reports as leader
        (after a leader is killed: once the others have elected a new one).

        Raises:
            RuntimeError: no leader agreed on by the running members within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            seen: set[str] = set()
            try:
                for m in self.members:
                    if m.running:
                        leader = int(str(self.status(m.name)["leader"]))
                        seen.add(f"{leader:x}")
            except (RuntimeError, ValueError, KeyError, IndexError) as e:
                last = repr(e)
                seen = set()
            names = {n for n, i in self._ids.items() if i in seen}
            if len(seen) == 1 and len(names) == 1 and self.member(next(iter(names))).running:
                return names.pop()
            if seen:
                last = f"leaders reported: {sorted(seen)}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"no agreed etcd leader within {timeout_s} s ({last})")
            time.sleep(0.1)

    def move_leader(self, target: str, *, timeout_s: float = 10.0) -> None:
        """``etcdctl move-leader`` to ``target``; returns once every member agrees."""
        current = self.leader(timeout_s=timeout_s)
        if current == target:
            return
        self._etcdctl(
            self.member(current).endpoint, "move-leader", self._ids[target], timeout_s=timeout_s
        )
        deadline = time.monotonic() + timeout_s
        while (now := self.leader(timeout_s=timeout_s)) != target:
            if time.monotonic() > deadline:
                raise RuntimeError(f"leader is {now} after move-leader to {target}")
            time.sleep(0.05)

    def watch_streams(self, member: str) -> int:
        """The number of open watch streams on ``member`` (its metrics gauge)."""
        url = f"{self.member(member).client_url}/metrics"
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode("utf-8", "replace")
        for line in text.splitlines():
            if line.startswith("etcd_debugging_mvcc_watch_stream_total "):
                return int(float(line.split()[1]))
        return 0

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(f"--- {m.name}\n{m.log_tail(lines)}" for m in self.members)

    # -- internals ----------------------------------------------------------------------

    def _build(self) -> None:
        self.members, self.proxies = [], []
        names = [f"{self.name}-{i}" for i in range(self.size)]
        listen_ports = [free_port() for _ in names]
        self.proxies = [
            PeerProxy(name=n, target_port=p) for n, p in zip(names, listen_ports, strict=True)
        ]
        initial = ",".join(f"{n}={p.url}" for n, p in zip(names, self.proxies, strict=True))
        token = f"{self.name}-{os.getpid()}-{self.proxies[0].port}"
        for n, port, proxy in zip(names, listen_ports, self.proxies, strict=True):
            m = EtcdProcess(
                name=n,
                base_dir=self.dir,
                start_timeout_s=self.start_timeout_s,
                peer_url=proxy.url,
                initial_cluster=initial,
                cluster_token=token,
                heartbeat_ms=CLUSTER_HEARTBEAT_MS,
                election_ms=CLUSTER_ELECTION_MS,
            )
            m.peer_port = port
            shutil.rmtree(m.data_dir, ignore_errors=True)
            self.members.append(m)

    def _teardown(self) -> None:
        for m in self.members:
            with contextlib.suppress(Exception):
                m.kill()
        for p in self.proxies:
            with contextlib.suppress(Exception):
                p.close()

    def _pick(self, member: str | None) -> list[EtcdProcess]:
        return list(self.members) if member is None else [self.member(member)]

    def _read_ids(self) -> dict[str, str]:
        out = self._etcdctl(self.endpoints[0], "member", "list", "-w", "json")
        ids: dict[str, str] = {}
        for entry in json.loads(out)["members"]:
            ids[str(entry["name"])] = f"{int(entry['ID']):x}"
        if set(ids) != {m.name for m in self.members}:
            raise RuntimeError(f"etcd member list is incomplete: {ids}")
        return ids

    def _etcdctl(self, endpoint: str, *args: str, timeout_s: float = 5.0) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        env["ETCDCTL_API"] = "3"
        cmd = [self.etcdctl, f"--endpoints={endpoint}", f"--command-timeout={timeout_s}s", *args]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s + 2, env=env, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"etcdctl {' '.join(args)} at {endpoint} timed out") from e
        if done.returncode != 0:
            raise RuntimeError(
                f"etcdctl {' '.join(args)} at {endpoint} failed: {done.stderr.strip()}"
            )
        return done.stdout


_LIVE_CLUSTERS: weakref.WeakSet[EtcdCluster] = weakref.WeakSet()


@atexit.register
def _close_leftover_clusters() -> None:
    for cluster in list(_LIVE_CLUSTERS):
        with contextlib.suppress(Exception):
            cluster.close()
