"""TLS, mutual TLS and admin authorisation, accepted and refused."""

from __future__ import annotations

import pathlib

import grpc
import pytest
from grpc import aio

from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from server.app import start_server

from .certs import make_pki
from .conftest import make_config
from .fakes import FakeAllocator

pytestmark = pytest.mark.timeout(30)

TOKEN = "s3cret-token"


def creds(ca: pathlib.Path, pair: object | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=pair.key.read_bytes() if pair else None,  # type: ignore[attr-defined]
        certificate_chain=pair.cert.read_bytes() if pair else None,  # type: ignore[attr-defined]
    )


async def set_capacity(
    channel: aio.Channel, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.StatusCode:
    try:
        await pb_grpc.AdminStub(channel).SetCapacity(
            pb.SetCapacityRequest(pool="gpu-a", capacity=12), metadata=metadata, timeout=5
        )
    except aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def test_token_auth(tmp_path: pathlib.Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = make_config(tmp_path, f"admin: {{token_file: {token_file}}}")
    server = await start_server(config, node=FakeAllocator(config.pools), serve_metrics=False)
    try:
        async with aio.insecure_channel(server.address) as ch:
            assert await set_capacity(ch) == grpc.StatusCode.UNAUTHENTICATED
            bad = (("authorization", "Bearer wrong"),)
            assert await set_capacity(ch, bad) == grpc.StatusCode.PERMISSION_DENIED
            basic = (("authorization", "Basic Zm9v"),)
            assert await set_capacity(ch, basic) == grpc.StatusCode.UNAUTHENTICATED
            good = (("authorization", f"Bearer {TOKEN}"),)
            assert await set_capacity(ch, good) == grpc.StatusCode.OK
            with pytest.raises(aio.AioRpcError) as info:
                await pb_grpc.AdminStub(ch).SetCapacity(
                    pb.SetCapacityRequest(pool="gpu-a", capacity=-1), metadata=good
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "capacity" in (info.value.details() or "")
            with pytest.raises(aio.AioRpcError) as info:
                await pb_grpc.AdminStub(ch).Switchover(
                    pb.SwitchoverRequest(pool="gpu-a", node="elsewhere"), metadata=good
                )
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await server.shutdown(0)


async def test_a_replaced_token_file_rotates_the_token_without_a_restart(
    tmp_path: pathlib.Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = make_config(tmp_path, f"admin: {{token_file: {token_file}}}")
    server = await start_server(config, node=FakeAllocator(config.pools), serve_metrics=False)
    old = (("authorization", f"Bearer {TOKEN}"),)
    new = (("authorization", "Bearer rotated-token"),)
    try:
        async with aio.insecure_channel(server.address) as ch:
            assert await set_capacity(ch, old) == grpc.StatusCode.OK
            # Replaced the way a mounted Secret is: a new file renamed over the old one.
            staged = tmp_path / "token.new"
            staged.write_text("rotated-token\n")
            staged.replace(token_file)
            assert await set_capacity(ch, new) == grpc.StatusCode.OK
            assert await set_capacity(ch, old) == grpc.StatusCode.PERMISSION_DENIED
            # Rewritten in place with a token of the same length: noticed too.
            token_file.write_text("rotated-tokeN\n")
            newer = (("authorization", "Bearer rotated-tokeN"),)
            assert await set_capacity(ch, newer) == grpc.StatusCode.OK
            assert await set_capacity(ch, new) == grpc.StatusCode.PERMISSION_DENIED
            # An empty replacement does not lock the operator out.
            staged.write_text("")
            staged.replace(token_file)
            assert await set_capacity(ch, newer) == grpc.StatusCode.OK
    finally:
        await server.shutdown(0)


async def test_tls_and_mtls_identities(tmp_path: pathlib.Path) -> None:
    ca, srv, clients = make_pki(tmp_path, ("ops-admin", "gateway"))
    config = make_config(
        tmp_path,
        f"tls: {{cert_file: {srv.cert}, key_file: {srv.key}, client_ca_file: {ca.cert}, "
        "admin_identities: [ops-admin]}",
    )
    server = await start_server(config, node=FakeAllocator(config.pools), serve_metrics=False)
    target = f"localhost:{server.port}"
    try:
        # An allowed identity may call Admin; another is denied; both may call Allocator.
        async with aio.secure_channel(target, creds(ca.cert, clients["ops-admin"])) as ch:
            assert await set_capacity(ch) == grpc.StatusCode.OK
        async with aio.secure_channel(target, creds(ca.cert, clients["gateway"])) as ch:
            assert await set_capacity(ch) == grpc.StatusCode.PERMISSION_DENIED
            r = await pb_grpc.AllocatorStub(ch).Acquire(
                pb.AcquireRequest(pool="gpu-a", team="inst-a"), timeout=5
            )
            assert r.granted
        # No client certificate: the TLS handshake itself is refused.
        async with aio.secure_channel(target, creds(ca.cert)) as ch:
            with pytest.raises(aio.AioRpcError) as info:
                await pb_grpc.AllocatorStub(ch).ListPools(pb.ListPoolsRequest(), timeout=2)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # Plaintext to a TLS port fails too.
        async with aio.insecure_channel(target) as ch:
            with pytest.raises(aio.AioRpcError):
                await pb_grpc.AllocatorStub(ch).ListPools(pb.ListPoolsRequest(), timeout=2)
    finally:
        await server.shutdown(0)


async def test_server_only_tls(tmp_path: pathlib.Path) -> None:
    ca, srv, _ = make_pki(tmp_path, ())
    config = make_config(tmp_path, f"tls: {{cert_file: {srv.cert}, key_file: {srv.key}}}")
    server = await start_server(config, node=FakeAllocator(config.pools), serve_metrics=False)
    try:
        async with aio.secure_channel(f"localhost:{server.port}", creds(ca.cert)) as ch:
            listing = await pb_grpc.AllocatorStub(ch).ListPools(pb.ListPoolsRequest(), timeout=5)
            assert [p.pool for p in listing.pools] == ["gpu-a", "gpu-b"]
            assert await set_capacity(ch) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.shutdown(0)
