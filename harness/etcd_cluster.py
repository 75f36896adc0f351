"""Three real etcd members on loopback as one cluster, for the failover drills and the
tests of a partitioned etcd.

``EtcdCluster`` runs three members as one cluster (100 ms heartbeat, 1 s election timeout,
so that a loaded test machine does not elect a new leader by accident), each member's peer
URL behind a ``TcpProxy`` in this process, so that a test can cut one member off from its
peers while its client URL keeps serving. It finds the leader and moves leadership with
``etcdctl``. Every wait is bounded; ``close`` stops every member and proxy, and a cluster
still running when the interpreter exits is closed then.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import weakref
from pathlib import Path

from harness.etcd import EtcdProcess, etcd_env, fast_tmp_root, find_etcdctl
from harness.net import LOOPBACK, free_port
from harness.proxy import TcpProxy

_FROM_HEADER = b"x-server-from:"


def peer_origin(head: bytes) -> str | None:
    """The sending member's id (hex) in an etcd peer request, from ``X-Server-From``.

    etcd 3.4 sets this header on every raft stream, pipeline and snapshot request; other
    peer requests (version, members) have none and are not raft traffic.
    """
    for line in head.split(b"\r\n"):
        if line.lower().startswith(_FROM_HEADER):
            return line[len(_FROM_HEADER) :].strip().decode("ascii", "replace").lower()
    return None


CLUSTER_HEARTBEAT_MS = 100
CLUSTER_ELECTION_MS = 1000
START_ATTEMPTS = 2
"""How many times ``EtcdCluster.start`` tries, each time on fresh ports (one may be taken)."""


class EtcdCluster:
    """Three etcd members on 127.0.0.1, each advertising its peer URL through a ``TcpProxy``.

    Members are named ``<name>-0`` … ``<name>-2``; ``members[i]`` serves ``endpoints[i]``.
    ``pause``/``resume``/``kill`` without a member act on all of them, as a single
    ``EtcdProcess`` does, so a drill written for one member runs against the cluster.

    Args:
        name: prefix of the member names and of the cluster token.
        base_dir: where the members' data dirs go; a RAM-backed temp dir by default.
        size: the number of members (3 by default).
        start_timeout_s: how long ``start`` waits for every member to be healthy.
        launcher: a shell script that starts each member (see ``EtcdProcess``); it also
            gets ``CLUSTER_CLIENT_URLS``, every member's client URL.
    """

    def __init__(
        self,
        *,
        name: str = "test-cluster",
        base_dir: Path | None = None,
        size: int = 3,
        start_timeout_s: float = 20.0,
        launcher: Path | None = None,
    ) -> None:
        self.name = name
        self.launcher = launcher
        self.size = size
        self.start_timeout_s = start_timeout_s
        self._own_dir = base_dir is None
        self.dir = (
            Path(tempfile.mkdtemp(prefix="fairshare-etcd-cluster-", dir=fast_tmp_root()))
            if base_dir is None
            else Path(base_dir)
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.etcdctl = find_etcdctl()
        self.members: list[EtcdProcess] = []
        self.proxies: list[TcpProxy] = []
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

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Starts every member (retrying once on fresh ports if a port was taken) and
        waits until all are healthy and agree on one leader."""
        for attempt in range(1, START_ATTEMPTS + 1):
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
                if attempt == START_ATTEMPTS:
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
        until it is healthy (it rejoins the cluster). A member started on an empty data
        dir by a launcher that adds it again has a new id: the ids are read again."""
        self.member(member).start()
        self._ids = self._read_ids()

    def member_list(self, member: str | int = 0) -> list[dict[str, object]]:
        """``etcdctl member list`` as one member sees it (the JSON ``members``)."""
        out = self._etcdctl(self.member(member).endpoint, "member", "list", "-w", "json")
        members = json.loads(out)["members"]
        assert isinstance(members, list)
        return members

    def isolate(self, member: str) -> None:
        """Cuts every peer connection to and from ``member``; its client URL keeps serving.

        Its peers then elect (or keep) a leader without it; the member itself has none.
        """
        index = self.members.index(self.member(member))
        self.proxies[index].cut()
        for i, proxy in enumerate(self.proxies):
            if i != index:
                proxy.cut(origins={self._ids[member]})

    def heal(self) -> None:
        """Lets every peer connection through again."""
        for proxy in self.proxies:
            proxy.heal()

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
            TcpProxy(f"{LOOPBACK}:{p}", name=f"peer-proxy-{n}", origin_of=peer_origin)
            for n, p in zip(names, listen_ports, strict=True)
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
            m.launcher = self.launcher
            m.peer_port = port
            shutil.rmtree(m.data_dir, ignore_errors=True)
            self.members.append(m)
        urls = ",".join(m.client_url for m in self.members)
        for m in self.members:
            m.launcher_env = {"CLUSTER_CLIENT_URLS": urls}

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
        env = etcd_env()
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
