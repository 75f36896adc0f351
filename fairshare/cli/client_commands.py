"""The commands that call a running allocator: ``status``, ``pools``, ``set-capacity``,
``switchover``; their flags and their output (tables, or JSON with ``--json``).

Each command opens one channel (plaintext, or TLS with ``--tls-ca``/``--tls-cert``), makes
its calls with the ``--timeout`` deadline each, writes to the stream it is given and returns
0. A failed call raises ``grpc.aio.AioRpcError``; an unreadable certificate or token file
raises ``OSError`` or ``ValueError``: ``fairshare.cli.main`` turns them into the exit status.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Coroutine
from typing import Any, Final, TextIO

import grpc
from grpc import aio

from fairshare.wire.channels import open_channel
from fairshare.wire.credentials import read_token
from fairshare.wire.metadata import bearer
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc

DEFAULT_TARGET: Final = "127.0.0.1:50051"
_SCIENTIFIC_FROM: Final = 1e5
"""A table cell shows a number of at least this magnitude in scientific notation."""


def _number(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return f"{value:.4g}" if abs(value) < _SCIENTIFIC_FROM else f"{value:.3e}"


def within_cell(team: pb.TeamStat) -> str:
    """The within-share count of the reservation, ``n/r``: ``4/4`` is a team holding all
    its reserved slots (however many it borrows besides); ``-/r`` when the owner did not
    send the count (an owner that predates it)."""
    count = str(team.within) if team.HasField("within") else "-"
    return f"{count}/{team.reserved}"


_COLUMNS: Final[tuple[tuple[str, Callable[[pb.TeamStat], str], str], ...]] = (
    ("team", lambda t: t.team, "<"),
    ("share", lambda t: _number(t.share), ">"),
    ("reserved", lambda t: str(t.reserved), ">"),
    ("within", within_cell, ">"),
    ("in flight", lambda t: str(t.in_flight), ">"),
    ("borrowing", lambda t: str(t.borrowing), ">"),
    ("phantoms", lambda t: str(t.phantoms), ">"),
    ("usage", lambda t: _number(t.usage), ">"),
    ("level fairshare", lambda t: _number(t.level_fairshare), ">"),
    ("rank", lambda t: str(t.rank), ">"),
)
"""The table's columns: title, the cell of a team, alignment."""


def format_table(snapshot: pb.SnapshotResponse) -> str:
    """One pool as an sshare-like table, headed by its capacity, owner and epoch."""
    rows: list[list[str]] = [[title for title, _, _ in _COLUMNS]]
    rows += [[cell(team) for _, cell, _ in _COLUMNS] for team in snapshot.teams]
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
    """One pool as plain JSON-able data; a team's ``within`` (its within-share count) is
    null when the owner did not send it."""
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
                "within": t.within if t.HasField("within") else None,
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
        return open_channel(args.target, credentials)
    return open_channel(args.target)


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _admin_metadata(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    path = args.token_file or os.environ.get("FAIRSHARE_ADMIN_TOKEN_FILE")
    if not path:
        return ()
    return (bearer(read_token(path)),)


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


def add_client_arguments(parser: argparse.ArgumentParser, *, admin: bool = False) -> None:
    parser.add_argument("--target", default=DEFAULT_TARGET, help="server HOST:PORT")
    parser.add_argument("--timeout", type=float, default=5.0, help="deadline per call, s")
    parser.add_argument("--tls-ca", help="CA certificate that signed the server's (TLS)")
    parser.add_argument("--tls-cert", help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key", help="client private key (mutual TLS)")
    if admin:
        parser.add_argument(
            "--token-file", help="admin bearer token file (default $FAIRSHARE_ADMIN_TOKEN_FILE)"
        )


COMMANDS: Final[dict[str, Callable[[argparse.Namespace, TextIO], Coroutine[Any, Any, int]]]] = {
    "status": _status,
    "pools": _pools,
    "set-capacity": _set_capacity,
    "switchover": _switchover,
}
"""Command name -> the coroutine that runs it, writing to the given stream."""
