"""Certificates rotate without a restart: the gRPC port, the peer channels and the etcd
client read their TLS files again when they change, and ``/healthz`` on the metrics port
tells that the event loop runs.

The files are replaced as Kubernetes replaces a mounted Secret (cert-manager renews into
one): the keys are symlinks through ``..data`` to a timestamped directory, and the whole
directory is swapped at once by renaming a new ``..data`` symlink over the old one.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from grpc import aio

from fairshare.errors import PeerUnavailable
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.store.contract import StoreUnavailable
from ha.store.etcd import AccessRefused, EtcdStore, connect
from harness.etcd import EtcdProcess, EtcdTls
from harness.net import free_port
from server.app import start_server
from server.config import load_config
from server.etcd_access import load_etcd_access
from server.metrics import HEALTHZ_PATH, Metrics, event_loop_alive
from server.peers import GrpcPeers
from server.tls_reload import CHECK_EVERY_S, peer_credentials

from .certs import Pair, make_pki
from .conftest import POOLS_YAML, make_config
from .fakes import FakeAllocator

pytestmark = pytest.mark.timeout(90)

SEEN_WITHIN_S = CHECK_EVERY_S + 4.0
"""How long a rotated file may take to reach the peer and etcd calls: the check interval,
plus a new channel's handshake on a loaded machine."""


class SecretVolume:
    """A directory laid out as kubelet lays out a mounted Secret (see module)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        path.mkdir()
        self._generation = 0

    def file(self, key: str) -> str:
        return str(self.path / key)

    def publish(self, files: dict[str, bytes]) -> None:
        """Writes a new generation of the files and swaps ``..data`` to it atomically."""
        self._generation += 1
        generation = self.path / f"..gen_{self._generation}"
        generation.mkdir()
        for key, data in files.items():
            (generation / key).write_bytes(data)
            link = self.path / key
            if not link.is_symlink():
                link.symlink_to(pathlib.Path("..data") / key)
        staged = self.path / "..data_tmp"
        staged.symlink_to(generation.name)
        os.replace(staged, self.path / "..data")


def _pair(pair: Pair, ca: Pair) -> dict[str, bytes]:
    return {
        "tls.crt": pair.cert.read_bytes(),
        "tls.key": pair.key.read_bytes(),
        "ca.crt": ca.cert.read_bytes(),
    }


def _presented(port: int) -> bytes:
    """The certificate the server presents to a new TLS connection (DER)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(pair: Pair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


def _creds(ca: Pair) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=ca.cert.read_bytes())


async def _list_pools(channel: aio.Channel) -> grpc.StatusCode:
    try:
        await pb_grpc.AllocatorStub(channel).ListPools(pb.ListPoolsRequest(), timeout=3)
    except aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def test_the_grpc_port_serves_a_rotated_certificate_to_new_connections(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca1, server1, _ = make_pki(_dir(tmp_path / "pki1"), ())
    ca2, server2, _ = make_pki(_dir(tmp_path / "pki2"), ())
    secret = SecretVolume(tmp_path / "tls")
    secret.publish(_pair(server1, ca1))
    config = make_config(
        tmp_path,
        f"tls: {{cert_file: {secret.file('tls.crt')}, key_file: {secret.file('tls.key')}}}",
    )
    server = await start_server(config, node=FakeAllocator(config.pools), serve_metrics=False)
    target = f"localhost:{server.port}"
    try:
        assert await asyncio.to_thread(_presented, server.port) == _der(server1)
        async with aio.secure_channel(target, _creds(ca1)) as before:
            assert await _list_pools(before) == grpc.StatusCode.OK

            secret.publish(_pair(server2, ca2))
            assert await asyncio.to_thread(_presented, server.port) == _der(server2)
            async with aio.secure_channel(target, _creds(ca2)) as after:
                assert await _list_pools(after) == grpc.StatusCode.OK
            async with aio.secure_channel(target, _creds(ca1)) as stale:
                assert await _list_pools(stale) == grpc.StatusCode.UNAVAILABLE
            # The connection opened before keeps working: nothing restarted.
            assert await _list_pools(before) == grpc.StatusCode.OK

        # A broken replacement leaves the last good certificate in force, and says so.
        secret.publish({"tls.crt": b"not a certificate\n", "tls.key": server2.key.read_bytes()})
        assert await asyncio.to_thread(_presented, server.port) == _der(server2)
        assert "keeping the previous TLS certificate of the gRPC port" in caplog.text
        # Fixed again: taken.
        secret.publish(_pair(server1, ca1))
        assert await asyncio.to_thread(_presented, server.port) == _der(server1)
    finally:
        await server.shutdown(0)


async def test_peer_channels_use_rotated_certificates(tmp_path: pathlib.Path) -> None:
    ca1, own1, _ = make_pki(_dir(tmp_path / "pki1"), ())
    ca2, own2, _ = make_pki(_dir(tmp_path / "pki2"), ())
    # The peer already runs on the new CA, with mutual TLS.
    peer_config = make_config(
        _dir(tmp_path / "peer"),
        f"tls: {{cert_file: {own2.cert}, key_file: {own2.key}, client_ca_file: {ca2.cert}}}",
    )
    peer = await start_server(
        peer_config, node=FakeAllocator(peer_config.pools), serve_metrics=False
    )
    secret = SecretVolume(tmp_path / "tls")
    secret.publish(_pair(own1, ca1))
    own_config = make_config(
        _dir(tmp_path / "own"),
        f"tls: {{cert_file: {secret.file('tls.crt')}, key_file: {secret.file('tls.key')}, "
        f"client_ca_file: {secret.file('ca.crt')}}}",
    )
    peers = GrpcPeers(credentials=peer_credentials(own_config))
    address = f"localhost:{peer.port}"
    try:
        with pytest.raises(PeerUnavailable):
            await peers.snapshot(address, "gpu-a", 3)
        secret.publish(_pair(own2, ca2))
        deadline = time.monotonic() + SEEN_WITHIN_S
        while True:
            try:
                view = await peers.snapshot(address, "gpu-a", 3)
                break
            except PeerUnavailable as e:
                assert time.monotonic() < deadline, f"rotated files not used: {e}"
                await asyncio.sleep(0.2)
        assert view.pool == "gpu-a"
    finally:
        await peers.close()
        await peer.shutdown(0)


# -- etcd ---------------------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: pathlib.Path) -> tuple[Pair, Pair, dict[str, Pair]]:
    return make_pki(_dir(tmp_path / "etcd-pki"), ("fairshare", "renewed", "root"))


@pytest.fixture
def etcd_tls(pki: tuple[Pair, Pair, dict[str, Pair]]) -> Iterator[EtcdProcess]:
    ca, server, clients = pki
    tls = EtcdTls(
        ca_file=ca.cert,
        cert_file=server.cert,
        key_file=server.key,
        client_cert=(clients["root"].cert, clients["root"].key),
    )
    with EtcdProcess(name="rotation-etcd", tls=tls) as etcd:
        yield etcd


async def test_the_etcd_client_uses_a_rotated_client_certificate(
    etcd_tls: EtcdProcess, pki: tuple[Pair, Pair, dict[str, Pair]], tmp_path: pathlib.Path
) -> None:
    ca, _, clients = pki
    _, _, strangers = make_pki(_dir(tmp_path / "other-pki"), ("stranger",))
    secret = SecretVolume(tmp_path / "etcd-tls")
    secret.publish(_pair(clients["fairshare"], ca))
    keys = tmp_path / "grant-keys"
    keys.write_text("ef" * 32 + "\n", encoding="utf-8")
    config = tmp_path / "pools.yaml"
    config.write_text(
        f"etcd:\n  endpoints: [{etcd_tls.client_url}]\n  ca_file: {secret.file('ca.crt')}\n"
        f"  cert_file: {secret.file('tls.crt')}\n  key_file: {secret.file('tls.key')}\n"
        f"grants: {{key_file: {keys}}}\n{POOLS_YAML}",
        encoding="utf-8",
    )
    access = load_etcd_access(load_config(config, environ={}).etcd)
    store = await connect([etcd_tls.client_url], rpc_timeout_s=2.0, access=access)
    key = "/rotation-test/k"
    try:
        await store.put(key, b"v1")
        # A certificate etcd does not trust: the new channel's handshake fails, which
        # shows the new files are in use.
        secret.publish(_pair(strangers["stranger"], ca))
        await _until_refused(store, key)
        # The renewed certificate, signed by etcd's CA: calls work again.
        secret.publish(_pair(clients["renewed"], ca))
        deadline = time.monotonic() + SEEN_WITHIN_S
        while True:
            try:
                got = await store.get(key)
                break
            except StoreUnavailable as e:
                assert time.monotonic() < deadline, f"renewed certificate not used: {e}"
                await asyncio.sleep(0.2)
        assert got is not None and got.value == b"v1"
    finally:
        await store.close()
    etcd_tls.etcdctl("del", "--prefix", "/rotation-test/")
    assert etcd_tls.etcdctl("get", "--prefix", "--keys-only", "/rotation-test/").strip() == ""


async def _until_refused(store: EtcdStore, key: str) -> None:
    deadline = time.monotonic() + SEEN_WITHIN_S
    while True:
        try:
            await store.get(key)
        except AccessRefused as e:
            assert "TLS handshake" in str(e), e
            return
        assert time.monotonic() < deadline, "the untrusted certificate was never used"
        await asyncio.sleep(0.2)


# -- liveness ------------------------------------------------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


async def test_healthz_answers_while_the_event_loop_runs(tmp_path: pathlib.Path) -> None:
    port = free_port()
    config = make_config(tmp_path, f"metrics_listen: 127.0.0.1:{port}")
    server = await start_server(config, node=FakeAllocator(config.pools))
    try:
        base = f"http://127.0.0.1:{port}"
        assert await asyncio.to_thread(_get, base + HEALTHZ_PATH) == (200, b"ok\n")
        status, body = await asyncio.to_thread(_get, base + "/metrics")
        assert status == 200 and b"fairshare_" in body
    finally:
        await server.shutdown(0)


async def test_healthz_fails_while_the_event_loop_is_blocked() -> None:
    alive = event_loop_alive(asyncio.get_running_loop(), timeout_s=0.3)
    metrics = Metrics(teams={})
    port = free_port()
    stop = metrics.serve(f"127.0.0.1:{port}", alive=alive)
    answers: list[tuple[int, bytes]] = []
    try:
        asked = threading.Thread(
            target=lambda: answers.append(_get(f"http://127.0.0.1:{port}{HEALTHZ_PATH}"))
        )
        asked.start()
        time.sleep(1.0)  # noqa: ASYNC251 (blocks the event loop, as a hung process would)
        await asyncio.to_thread(asked.join, 5)
        assert answers and answers[0][0] == 503, answers
        assert await asyncio.to_thread(_get, f"http://127.0.0.1:{port}{HEALTHZ_PATH}") == (
            200,
            b"ok\n",
        )
    finally:
        stop()


def _dir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
