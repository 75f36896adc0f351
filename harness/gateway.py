"""``fairshare gateway`` processes on loopback, for tests, demos and benchmarks.

``Gateway`` writes its configuration file and starts ``fairshare gateway`` on a free port;
``wait_gateway`` polls its ``/readyz`` (or ``/healthz``) until it answers 200.

``wait_gateway`` guarantees: it returns only after a 200; it raises ``ServerExited`` as soon
as it sees the process gone and ``TimeoutError`` after ``timeout_s``, each with the end of
the log. Not guaranteed: that the gateway still serves at the caller's next request.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.http import wait_http
from harness.net import LOOPBACK, free_port
from harness.process import ROOT, ServerProcess

GATEWAY = (sys.executable, "-m", "fairshare.cli", "gateway")
"""How the gateway is started: the module the ``fairshare`` command runs."""


class Gateway(ServerProcess):
    """One gateway: ``fairshare gateway`` with ``config`` (a mapping written as the YAML
    file ``workdir/<name>.yaml``; JSON is YAML), its API on ``address`` (a free loopback
    port by default) and its metrics on another free port (``metrics_address``), its log
    in ``workdir/<name>.log``. Not started: ``start`` it."""

    def __init__(
        self,
        workdir: Path,
        config: Mapping[str, object],
        *,
        name: str = "gateway",
        address: str | None = None,
        metrics: bool = True,
        env: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.config_path = workdir / f"{name}.yaml"
        address = address or f"{LOOPBACK}:{free_port()}"
        self.metrics_address = f"{LOOPBACK}:{free_port()}" if metrics else ""
        self.write_config(config)
        args = [
            *GATEWAY,
            "--config",
            str(self.config_path),
            "--listen",
            address,
            "--metrics-listen",
            self.metrics_address,
            *extra,
        ]
        super().__init__(args, address=address, log=workdir / f"{name}.log", env=env)

    @property
    def url(self) -> str:
        """The API's base URL (``http://127.0.0.1:PORT``); OpenAI clients add ``/v1``."""
        return f"http://{self.address}"

    def write_config(self, config: Mapping[str, object]) -> None:
        """Writes the configuration file (read at the next start)."""
        self.config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")

    def metrics_text(self) -> str:
        """The Prometheus text of ``/metrics`` ("" without a metrics port).

        It blocks up to 5 s: from a test's event loop, call ``metrics_text_async``.
        """
        if not self.metrics_address:
            return ""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=5) as r:
            return str(r.read().decode())

    async def metrics_text_async(self) -> str:
        """``metrics_text`` in a worker thread: the caller's event loop (the SDK streams
        of a test) runs on meanwhile."""
        return await asyncio.to_thread(self.metrics_text)


def run_gateway_command(
    *args: str, stdin: str | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``fairshare gateway ARGS`` run to its end (a start that fails on its configuration,
    ``hash-key``) with ``stdin`` as its input: its exit status and output, as text."""
    return subprocess.run(
        [*GATEWAY, *args],
        input=stdin,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


async def wait_gateway(
    gateway: Gateway, *, timeout_s: float = 30.0, path: str = "/readyz", interval_s: float = 0.05
) -> None:
    """Waits until ``path`` of the gateway answers 200 (``harness.http.wait_http``).

    Raises:
        ServerExited: the process ended first.
        TimeoutError: no 200 within ``timeout_s``.
    """
    await wait_http(gateway.url + path, process=gateway, timeout_s=timeout_s, interval_s=interval_s)
