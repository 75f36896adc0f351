"""``python -m fairshare.sim.standin``: the command line of the stand-in vLLM server.

It prints ``standin listening on HOST:PORT`` once it serves and ends on SIGTERM or SIGINT
(exit 0); a bad command line exits 2, as argparse does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from fairshare.sim.standin.app import Settings, Standin
from fairshare.sim.standin.scheduler import POLICIES


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host.strip("[]"), int(port)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairshare.sim.standin", description=__doc__)
    p.add_argument("--listen", type=_address, required=True, metavar="HOST:PORT")
    p.add_argument("--model", action="append", dest="models", metavar="NAME")
    p.add_argument("--max-running", type=_positive_int, default=4)
    p.add_argument("--tokens-per-s", type=_positive_float, default=50.0)
    p.add_argument("--prefill-s", type=float, default=0.0)
    p.add_argument("--scheduling-policy", choices=POLICIES, default="priority")
    p.add_argument("--max-tokens-default", type=_positive_int, default=16)
    p.add_argument(
        "--dev-mode",
        action="store_true",
        help="serve GET /server_info, as vLLM does with VLLM_SERVER_DEV_MODE=1",
    )
    p.add_argument(
        "--store-responses",
        action="store_true",
        help="keep Responses answers for GET and cancel, as vLLM does with "
        "VLLM_ENABLE_RESPONSES_API_STORE=1",
    )
    return p


async def serve(host: str, port: int, settings: Settings) -> None:
    """Serves until SIGTERM or SIGINT."""
    runner = web.AppRunner(
        Standin(settings).app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"standin listening on {host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.prefill_s < 0:
        parser().error("--prefill-s must not be negative")
    settings = Settings(
        models=tuple(args.models or ("standin",)),
        max_running=args.max_running,
        tokens_per_s=args.tokens_per_s,
        prefill_s=args.prefill_s,
        policy=args.scheduling_policy,
        max_tokens_default=args.max_tokens_default,
        dev_mode=args.dev_mode,
        store_responses=args.store_responses,
    )
    host, port = args.listen
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, port, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
