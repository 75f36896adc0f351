"""The ``fairshare`` command line.

Commands:
    serve          run a replica (``server.app``)
    status         an sshare-like table of each pool's teams, with owner and epoch
    pools          every pool with its capacity, owner, epoch and degraded mode
    set-capacity   change a pool's capacity (admin credentials)
    switchover     move a pool to a named replica (admin credentials)
    simulate       the offline simulator (``sim.cli``)

Exit status: 0 on success, 1 when a call fails, 2 on a usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

import grpc
from grpc import aio

from server.auth import read_token
from server.pb.fairshare.v1 import allocator_pb2 as pb
from server.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

DEFAULT_TARGET: Final = "127.0.0.1:50051"
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2

_COLUMNS: Final = (
    ("team", "team", "<"),
    ("share", "share", ">"),
    ("reserved", "reserved", ">"),
    ("in flight", "in_flight", ">"),
    ("borrowing", "borrowing", ">"),
    ("phantoms", "phantoms", ">"),
    ("usage", "usage", ">"),
    ("level fairshare", "level_fairshare", ">"),
    ("rank", "rank", ">"),
)


def _number(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"


def format_table(snapshot: pb.SnapshotResponse) -> str:
    """One pool as an sshare-like table, headed by its capacity, owner and epoch."""
    rows: list[list[str]] = [[title for title, _, _ in _COLUMNS]]
    for team in snapshot.teams:
        row = []
        for _, name, _ in _COLUMNS:
            value = getattr(team, name)
            row.append(_number(value) if isinstance(value, float) else str(value))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    owner = snapshot.owner or "(none)"
    lines = [
        f"pool {snapshot.pool}  capacity {snapshot.capacity}  owner {owner}  epoch {snapshot.epoch}"
    ]
    for row in rows:
        cells = [
            f"{cell:{align}{width}}"
            for cell, width, (_, _, align) in zip(row, widths, _COLUMNS, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _json_number(value: float) -> float | None:
    # Strict JSON has no infinity: a team with a share and no usage prints null.
    return value if math.isfinite(value) else None


def snapshot_dict(snapshot: pb.SnapshotResponse) -> dict[str, Any]:
    """One pool as plain JSON-able data."""
    return {
        "pool": snapshot.pool,
        "capacity": snapshot.capacity,
        "owner": snapshot.owner,
        "epoch": snapshot.epoch,
        "teams": [
            {
                "team": t.team,
                "share": t.share,
                "reserved": t.reserved,
                "in_flight": t.in_flight,
                "borrowing": t.borrowing,
                "in_flight_tokens": t.in_flight_tokens,
                "usage": t.usage,
                "level_fairshare": _json_number(t.level_fairshare),
                "rank": t.rank,
                "phantoms": t.phantoms,
            }
            for t in snapshot.teams
        ],
    }


def _channel(args: argparse.Namespace) -> aio.Channel:
    if args.tls_ca or args.tls_cert:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(args.tls_ca),
            private_key=_read(args.tls_key),
            certificate_chain=_read(args.tls_cert),
        )
        return aio.secure_channel(args.target, credentials)
    return aio.insecure_channel(args.target)


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _admin_metadata(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    path = args.token_file or os.environ.get("FAIRSHARE_ADMIN_TOKEN_FILE")
    if not path:
        return ()
    return (("authorization", f"Bearer {read_token(path)}"),)


async def _status(args: argparse.Namespace, out: TextIO) -> int:
    async with _channel(args) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        if args.pool:
            names = [args.pool]
        else:
            listing = await stub.ListPools(pb.ListPoolsRequest(), timeout=args.timeout)
            names = [p.pool for p in listing.pools]
        snapshots = [
            await stub.Snapshot(pb.SnapshotRequest(pool=name), timeout=args.timeout)
            for name in names
        ]
    if args.json:
        json.dump([snapshot_dict(s) for s in snapshots], out, indent=2, allow_nan=False)
        out.write("\n")
    else:
        out.write("\n\n".join(format_table(s) for s in snapshots) + "\n")
    return 0


async def _pools(args: argparse.Namespace, out: TextIO) -> int:
    async with _channel(args) as channel:
        listing = await pb_grpc.AllocatorStub(channel).ListPools(
            pb.ListPoolsRequest(), timeout=args.timeout
        )
    if args.json:
        rows = [
            {
                "pool": p.pool,
                "capacity": p.capacity,
                "owner": p.owner,
                "owner_address": p.owner_address,
                "epoch": p.epoch,
                "degraded_mode": pb.DegradedMode.Name(p.degraded_mode).lower(),
            }
            for p in listing.pools
        ]
        json.dump(rows, out, indent=2)
        out.write("\n")
        return 0
    out.write(f"{'pool':<16} {'capacity':>8}  {'owner':<16} {'epoch':>8}  degraded mode\n")
    for p in listing.pools:
        mode = pb.DegradedMode.Name(p.degraded_mode).lower()
        owner = p.owner or "(none)"
        out.write(f"{p.pool:<16} {p.capacity:>8}  {owner:<16} {p.epoch:>8}  {mode}\n")
    return 0


async def _set_capacity(args: argparse.Namespace, out: TextIO) -> int:
    async with _channel(args) as channel:
        r = await pb_grpc.AdminStub(channel).SetCapacity(
            pb.SetCapacityRequest(pool=args.pool, capacity=args.capacity),
            timeout=args.timeout,
            metadata=_admin_metadata(args),
        )
    out.write(f"pool {args.pool}: capacity {r.previous} -> {args.capacity}\n")
    return 0


async def _switchover(args: argparse.Namespace, out: TextIO) -> int:
    async with _channel(args) as channel:
        await pb_grpc.AdminStub(channel).Switchover(
            pb.SwitchoverRequest(pool=args.pool, node=args.node),
            timeout=args.timeout,
            metadata=_admin_metadata(args),
        )
    out.write(f"pool {args.pool}: switchover to {args.node} requested\n")
    return 0


def _client_arguments(parser: argparse.ArgumentParser, *, admin: bool = False) -> None:
    parser.add_argument("--target", default=DEFAULT_TARGET, help="server HOST:PORT")
    parser.add_argument("--timeout", type=float, default=5.0, help="deadline per call, s")
    parser.add_argument("--tls-ca", help="CA certificate that signed the server's (TLS)")
    parser.add_argument("--tls-cert", help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key", help="client private key (mutual TLS)")
    if admin:
        parser.add_argument(
            "--token-file", help="admin bearer token file (default $FAIRSHARE_ADMIN_TOKEN_FILE)"
        )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    from server.app import add_serve_arguments

    parser = argparse.ArgumentParser(prog="fairshare", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(sub.add_parser("serve", help="run an allocator replica"))
    status = sub.add_parser("status", help="sshare-like table of each pool")
    _client_arguments(status)
    status.add_argument("--pool", help="only this pool")
    status.add_argument("--json", action="store_true", help="print JSON")
    pools = sub.add_parser("pools", help="list the pools")
    _client_arguments(pools)
    pools.add_argument("--json", action="store_true", help="print JSON")
    capacity = sub.add_parser("set-capacity", help="change a pool's capacity (admin)")
    capacity.add_argument("pool")
    capacity.add_argument("capacity", type=int)
    _client_arguments(capacity, admin=True)
    switchover = sub.add_parser("switchover", help="move a pool to a replica (admin)")
    switchover.add_argument("pool")
    switchover.add_argument("node")
    _client_arguments(switchover, admin=True)
    sub.add_parser("simulate", help="offline simulator (sim)", add_help=False)
    return parser


_CLIENT_COMMANDS: Final = {
    "status": _status,
    "pools": _pools,
    "set-capacity": _set_capacity,
    "switchover": _switchover,
}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Entry point of the ``fairshare`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:
        # The simulator parses its own arguments; import it only when asked for.
        sim: Any = importlib.import_module("sim.cli")
        return int(sim.main(argv[1:]))
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from server.app import run

        return run(args)
    stream = out if out is not None else sys.stdout
    try:
        return asyncio.run(_CLIENT_COMMANDS[args.command](args, stream))
    except aio.AioRpcError as e:
        print(f"fairshare {args.command}: {e.code().name}: {e.details()}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, ValueError) as e:
        print(f"fairshare {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
