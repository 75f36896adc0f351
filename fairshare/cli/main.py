"""The ``fairshare`` command line.

This module parses the arguments and runs one command (its first line is the help text).

Commands:
    serve          run a replica (``server.app``)
    gateway        the OpenAI-compatible proxy in front of vLLM (``fairshare.gateway.app``);
                   ``gateway hash-key``: the keys-file entry of each key read from stdin
    status         an sshare-like table of each pool's teams, with owner and epoch
    pools          every pool with its capacity, owner, epoch and degraded mode
    set-capacity   change a pool's capacity (admin credentials)
    switchover     move a pool to a named replica (admin credentials)
    simulate       the offline simulator (``sim``; the same as ``python -m fairshare.sim``)

Exit status: 0 on success, 1 when a call fails, 2 on a usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Final, TextIO

from grpc import aio

import fairshare.sim.command
from fairshare.cli.client_commands import COMMANDS, add_client_arguments

EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    from server.app import add_serve_arguments

    parser = argparse.ArgumentParser(prog="fairshare", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(sub.add_parser("serve", help="run an allocator replica"))
    from fairshare.gateway.app import add_gateway_arguments

    add_gateway_arguments(
        sub.add_parser(
            "gateway",
            help="run the OpenAI-compatible gateway",
            epilog="fairshare gateway hash-key < KEYS: print the hashed keys-file entry "
            "(sha256:<hex>) of each API key read from stdin, one a line",
        )
    )
    status = sub.add_parser("status", help="sshare-like table of each pool")
    add_client_arguments(status)
    status.add_argument("--pool", help="only this pool")
    status.add_argument("--json", action="store_true", help="print JSON")
    pools = sub.add_parser("pools", help="list the pools")
    add_client_arguments(pools)
    pools.add_argument("--json", action="store_true", help="print JSON")
    capacity = sub.add_parser("set-capacity", help="change a pool's capacity (admin)")
    capacity.add_argument("pool")
    capacity.add_argument("capacity", type=int)
    add_client_arguments(capacity, admin=True)
    switchover = sub.add_parser("switchover", help="move a pool to a replica (admin)")
    switchover.add_argument("pool")
    switchover.add_argument("node")
    add_client_arguments(switchover, admin=True)
    sub.add_parser("simulate", help="offline simulator (sim)", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Entry point of the ``fairshare`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"] or argv[:2] == ["gateway", "hash-key"]:
        return _parses_its_own(argv, out)
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from server.app import run

        return run(args)
    if args.command == "gateway":
        from fairshare.gateway.app import run as run_gateway

        return run_gateway(args)
    stream = out if out is not None else sys.stdout
    try:
        return asyncio.run(COMMANDS[args.command](args, stream))
    except aio.AioRpcError as e:
        print(f"fairshare {args.command}: {e.code().name}: {e.details()}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, ValueError) as e:
        print(f"fairshare {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


def _parses_its_own(argv: list[str], out: TextIO | None) -> int:
    """A command that parses its own arguments: the simulator (``python -m fairshare.sim``
    takes the same), or ``gateway hash-key`` (not the gateway's flags)."""
    if argv[0] == "simulate":
        return fairshare.sim.command.main(argv[1:])
    from fairshare.gateway.keys import hash_key_main

    return hash_key_main(argv[2:], stdout=out)
