"""Every gRPC channel a shipped package opens states its reconnect backoff and DNS
re-resolution (gRPC's defaults: 1 s growing to 120 s, one resolution per 30 s).

Read from the source with ``ast``: a channel constructor (``insecure_channel``,
``secure_channel``, sync or ``aio``) may be called only where the options are set, in
``fairshare/wire/channels.py`` (replicas) and ``ha/store/etcd/client.py`` (etcd, with the options of
``ha.store.etcd.connection``). tests/integration/test_channel_dns.py shows the options at work.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fairshare.wire.channels import CHANNEL_OPTIONS
from ha.store.etcd import connection

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("fairshare", "wire", "client", "ha", "server", "sim", "cli")
"""The packages of the wheel (pyproject.toml's setuptools include)."""
CONSTRUCTORS = {"insecure_channel", "secure_channel"}
WHERE_OPTIONS_ARE_SET = {"fairshare/wire/channels.py", "ha/store/etcd/client.py"}
LIMITS = (
    "grpc.initial_reconnect_backoff_ms",
    "grpc.max_reconnect_backoff_ms",
    "grpc.dns_min_time_between_resolutions_ms",
)


def channel_constructions() -> list[str]:
    """``path:line`` of every call of a channel constructor in the shipped packages."""
    found = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "/pb/" in path.as_posix():
                continue  # generated stubs open no channel
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in CONSTRUCTORS:
                    found.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    return found


def test_channels_are_opened_only_where_their_limits_are_set() -> None:
    found = channel_constructions()
    assert found, "the scan found no channel at all: it is looking in the wrong place"
    elsewhere = [f for f in found if f.rpartition(":")[0] not in WHERE_OPTIONS_ARE_SET]
    assert elsewhere == [], f"channels opened without fairshare.wire.channels: {elsewhere}"


def test_replica_channels_bound_backoff_and_resolve_names_again_within_a_second() -> None:
    options = dict(CHANNEL_OPTIONS)
    for key in LIMITS:
        assert key in options, key
    assert options["grpc.max_reconnect_backoff_ms"] <= 1000
    assert options["grpc.dns_min_time_between_resolutions_ms"] <= 1000


def test_etcd_channels_bound_backoff_and_resolve_names_again_within_a_second() -> None:
    options = connection._channel_options(rpc_timeout_s=0.5)
    for key in LIMITS:
        assert key in options, key
    assert options["grpc.max_reconnect_backoff_ms"] <= 1000
    assert options["grpc.dns_min_time_between_resolutions_ms"] <= 1000
