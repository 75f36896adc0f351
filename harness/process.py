"""A server child process on loopback whose output goes to a log file.

``ServerProcess`` is what tests, drills and benchmarks hold for every process they start
that serves on an address (an allocator, the benchmarks' echo server). It can be started
again after it ended (a restart on the same address), signalled, waited for, stopped and
killed.

Guarantees: ``kill`` ends and reaps the process, also when it is paused (SIGSTOP);
``stop`` and ``wait`` never block longer than the timeout they are given (``kill``: 10 s);
the log is appended to across restarts. Not guaranteed: that the process serves once
``start`` returns (``harness.serve.wait_serving`` waits for that).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: the working directory of every process started here, so that
``python -m <package>`` runs this checkout's code."""


class ServerProcess:
    """One child process serving on ``address`` (``127.0.0.1:<port>``).

    Args:
        args: the command line.
        address: where it serves.
        log: the file its stdout and stderr are appended to.
        cwd: its working directory (the repository root by default).
        env: its environment (this process's by default).
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        address: str,
        log: Path,
        cwd: Path = ROOT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        self.address = address
        self.log_path = log
        self.cwd = cwd
        self.env = None if env is None else dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Starts the process (again, after it ended); returns without waiting for it."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def signal(self, sig: signal.Signals) -> None:
        """Sends ``sig`` if the process is alive; does nothing otherwise."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int | None:
        """Its exit status, or None if it has not exited within ``timeout_s`` (or was never
        started)."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
        if self.alive:
            self.signal(signal.SIGTERM)
            if self.wait(timeout_s) is None:
                self.kill()

    def kill(self) -> None:
        """SIGKILL (after a SIGCONT, should it be paused), and reaps it."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_text(self) -> str:
        """Everything it logged so far ("" before its first start)."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its log, for failure messages."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_text().splitlines()[-lines:])
        return ""


def wait_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Waits until every thread of ``pid`` is in the stopped state (``T``) after a SIGSTOP;
    off Linux, where /proc is not there, returns at once.

    Raises:
        RuntimeError: some thread still runs after ``timeout_s``.
    """
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
