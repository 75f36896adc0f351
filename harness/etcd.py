"""One real etcd member on loopback, for integration tests, drills and benchmarks.

``EtcdProcess`` owns one ``etcd`` child process, its data dir and its two ports (client
and peer). It can stop, kill, pause (SIGSTOP), resume (SIGCONT) and restart the member on
the same data dir and ports, so a test sees what a client sees when its etcd goes away
and comes back with the same data.

A single member runs with a 50 ms heartbeat and a 500 ms election timeout, which lowers
etcd's minimum lease TTL to 1 s (with the defaults a 1 s lease is granted 2 s). Three
members as one cluster are ``harness.etcd_cluster.EtcdCluster``.

With ``tls`` the member serves its clients over TLS only (``https://``), requiring a
client certificate signed by the CA; ``etcdctl`` then presents ``tls.client_cert``.

Every wait is bounded; ``close`` stops the member and deletes its data, and a member
still running when the interpreter exits is closed then.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from harness.net import free_port, listens
from harness.process import wait_stopped

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
    """No ``etcd`` (or ``etcdctl``) binary on this machine."""


def find_etcd() -> str:
    """The etcd binary: on PATH, else in the system directories Debian installs into.

    Raises:
        EtcdNotInstalled: with the command that installs it.
    """
    found = shutil.which("etcd") or shutil.which("etcd", path="/usr/sbin:/usr/bin")
    if found is None:
        raise EtcdNotInstalled(_MISSING_HINT)
    return found


def find_etcdctl() -> str:
    """The etcdctl binary (Debian's etcd-client), for leader queries and moves."""
    found = shutil.which("etcdctl") or shutil.which("etcdctl", path="/usr/sbin:/usr/bin")
    if found is None:
        raise EtcdNotInstalled(
            "etcdctl was not found on PATH: run `make etcd`, which installs Debian's "
            "etcd-client with etcd-server"
        )
    return found


def etcd_env() -> dict[str, str]:
    """This process's environment without ``ETCD*`` variables, which etcd and etcdctl
    would read as flags."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}


def fast_tmp_root() -> str | None:
    """A RAM-backed directory when the machine has one: etcd fsyncs every write."""
    shm = Path(os.sep, "dev", "shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return None


@dataclass(frozen=True)
class EtcdTls:
    """TLS on a member's client port, with client certificates required.

    Attributes:
        ca_file: the CA that signs the server and client certificates.
        cert_file: the server certificate (it must name 127.0.0.1).
        key_file: its key.
        client_cert: the (certificate, key) files the harness presents (health checks,
            etcdctl); with etcd auth on, the certificate's CN is the etcd user.
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert: tuple[Path, Path]

    def context(self) -> ssl.SSLContext:
        """An ssl context that verifies the member and presents ``client_cert``."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(*map(str, self.client_cert))
        return context


AUTO_COMPACTION = ("--auto-compaction-mode", "periodic", "--auto-compaction-retention", "30s")
"""Every member keeps a bounded history, as the shipped etcd does (docs/deploy.md gives the
formula). etcd 3.4's periodic compactor with a retention R under an hour compacts every R to
the revision it saw R earlier, so at most 2R = 60 s of history is kept: at the benchmarks'
~250 durable writes/s of a few KB each (one pool under full load) that is under 100 MB of
RAM-backed data dir, where without compaction it grew for as long as the member ran. A test
that watches from a revision it read seconds earlier is far inside the window."""


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
        tls: TLS with client certificates on the client port; plaintext by default.
        auth_token_ttl_s: etcd's ``--auth-token-ttl`` (simple tokens), for tests of
            token expiry; etcd's default (300 s) when None.

    Attributes:
        launcher: None, or a shell script that starts etcd (the shipped ``deploy/etcd``
            start script): the member's settings then go to it as ``ETCD_*`` variables,
            as in a pod, with ``launcher_env`` added and a ``PATH`` holding only
            ``etcd``, ``etcdctl`` and ``sleep``, so the script can use nothing the pod
            lacks. Set before the first start.
        launcher_env: more variables for the launcher.
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
        tls: EtcdTls | None = None,
        auth_token_ttl_s: int | None = None,
    ) -> None:
        self.binary = find_etcd()
        self.name = name
        self.start_timeout_s = start_timeout_s
        self._own_dir = base_dir is None
        root = Path(tempfile.mkdtemp(prefix="fairshare-etcd-", dir=fast_tmp_root()))
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
        self.tls = tls
        self._auth_token_ttl_s = auth_token_ttl_s
        self.launcher: Path | None = None
        self.launcher_env: dict[str, str] = {}

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
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://{self.endpoint}"

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
        wait_stopped(self._proc.pid)

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
            *AUTO_COMPACTION,
            "--logger",
            "zap",
            "--log-level",
            "warn",
            *self._security_args(),
        ]
        env = etcd_env()
        if self.launcher is not None:
            env = {**env, **self._launcher_env(args[1:])}
            args = [shutil.which("sh") or "/bin/sh", str(self.launcher)]
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        _LIVE.add(self)

    def etcdctl(self, *args: str, timeout_s: float = 10.0) -> str:
        """Runs ``etcdctl`` against this member (with the client certificate under
        TLS) and returns its output.

        Raises:
            RuntimeError: etcdctl failed (its output in the message).
        """
        flags = [f"--endpoints={self.client_url}", f"--command-timeout={timeout_s}s"]
        if self.tls is not None:
            cert, key = self.tls.client_cert
            flags += [f"--cacert={self.tls.ca_file}", f"--cert={cert}", f"--key={key}"]
        done = subprocess.run(
            [find_etcdctl(), *flags, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s + 5,
            env={**etcd_env(), "ETCDCTL_API": "3"},
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr or done.stdout}")
        return done.stdout

    def _launcher_env(self, flags: list[str]) -> dict[str, str]:
        """The environment that gives etcd ``flags`` (and etcdctl the client certificate)
        through a launcher script, with only etcd, etcdctl and sleep on ``PATH``."""
        env = dict(self.launcher_env)
        i = 0
        while i < len(flags):
            name, eq, value = flags[i].removeprefix("--").partition("=")
            if not eq:
                if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
                    value = flags[i + 1]
                    i += 1
                else:
                    value = "true"
            env["ETCD_" + name.upper().replace("-", "_")] = value
            i += 1
        if self.tls is not None:
            cert, key = self.tls.client_cert
            env["ETCDCTL_CACERT"] = str(self.tls.ca_file)
            env["ETCDCTL_CERT"], env["ETCDCTL_KEY"] = str(cert), str(key)
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        tools = {"etcd": self.binary, "etcdctl": find_etcdctl(), "sleep": shutil.which("sleep")}
        for tool, target in tools.items():
            assert target is not None, f"no {tool} on PATH"
            link = bin_dir / tool
            if not link.exists():
                link.symlink_to(target)
        env["PATH"] = str(bin_dir)
        return env

    def _security_args(self) -> list[str]:
        args: list[str] = []
        if self.tls is not None:
            args += ["--client-cert-auth", f"--trusted-ca-file={self.tls.ca_file}"]
            args += [f"--cert-file={self.tls.cert_file}", f"--key-file={self.tls.key_file}"]
        if self._auth_token_ttl_s is not None:
            # The cheapest bcrypt cost etcd accepts: every Authenticate checks a hash.
            args += ["--auth-token=simple", f"--auth-token-ttl={self._auth_token_ttl_s}"]
            args += ["--bcrypt-cost=4"]
        return args

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise RuntimeError(f"etcd exited with {code} at start:\n{self.log_tail()}")
            try:
                context = None if self.tls is None else self.tls.context()
                url = f"{self.client_url}/health"
                with urllib.request.urlopen(url, timeout=1, context=context) as resp:
                    doc = json.loads(resp.read())
                if doc.get("health") == "true" and listens(proc.pid, self.client_port):
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
