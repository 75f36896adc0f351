"""Stand-in vLLM servers (``python -m fairshare.sim.standin``) as child processes on loopback.

``Standin`` builds the command line once, so tests, the demo and the benchmark start the
stand-in the same way; ``wait_standin`` waits until one answers ``GET /health``.

``wait_standin`` guarantees: it returns only after a 200 from ``/health``; it raises
``ServerExited`` as soon as it sees the given process gone, ``TimeoutError`` after
``timeout_s``. It does not guarantee that the server still serves at the caller's next call.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.http import wait_http
from harness.net import LOOPBACK, free_port
from harness.process import ServerProcess

STANDIN = (sys.executable, "-m", "fairshare.sim.standin")
"""How the stand-in is started."""


class Standin(ServerProcess):
    """One stand-in on ``address`` (a free loopback port by default), its log in
    ``workdir/<name>.log`` (``name``: ``standin-<port>`` by default). Not started: ``start``
    it (again, after a stop: same address, records lost). ``dev_mode`` serves
    ``/server_info`` (vLLM's ``VLLM_SERVER_DEV_MODE=1``); ``extra`` is appended to the
    command line as is."""

    def __init__(
        self,
        workdir: Path,
        *,
        models: Sequence[str] = ("standin",),
        max_running: int = 4,
        tokens_per_s: float = 50.0,
        prefill_s: float = 0.0,
        policy: str = "priority",
        address: str | None = None,
        name: str | None = None,
        dev_mode: bool = False,
        extra: Sequence[str] = (),
    ) -> None:
        address = address or f"{LOOPBACK}:{free_port()}"
        args = [*STANDIN, "--listen", address]
        for model in models:
            args += ["--model", model]
        args += ["--max-running", str(max_running), "--tokens-per-s", str(tokens_per_s)]
        args += ["--prefill-s", str(prefill_s), "--scheduling-policy", policy]
        args += [*(["--dev-mode"] if dev_mode else []), *extra]
        name = name or f"standin-{address.rpartition(':')[2]}"
        super().__init__(args, address=address, log=workdir / f"{name}.log")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the base URL (the OpenAI SDK's ``base_url`` is this
        plus ``/v1``)."""
        return f"http://{self.address}"


async def wait_standin(
    url: str,
    timeout_s: float = 30.0,
    *,
    process: ServerProcess | None = None,
    interval_s: float = 0.05,
) -> None:
    """Waits until ``GET {url}/health`` answers 200 (``harness.http.wait_http``).

    Raises:
        ServerExited: ``process`` ended first.
        TimeoutError: no 200 within ``timeout_s``.
    """
    await wait_http(f"{url}/health", process=process, timeout_s=timeout_s, interval_s=interval_s)
