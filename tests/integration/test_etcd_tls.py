"""etcd as production runs it: TLS with client certificates, and username/password auth.

Each test starts its own etcd member with certificates it makes (a CA, a server
certificate for 127.0.0.1, client certificates) and checks what the store, and one
``fairshare serve`` process, see: it works with the right credentials and fails at once,
saying why, without them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
from collections.abc import Iterator

import pytest

from ha.store.contract import StoreUnavailable
from ha.store.etcd import EtcdAccess, EtcdStore, connect
from ha.store.etcd.connection import Connection
from ha.store.etcd.errors import translate_reason
from harness.etcd import EtcdProcess, EtcdTls
from harness.serve import Allocator, run_serve, serve_args, wait_serving

from .certs import Pair, make_pki
from .conftest import POOLS_YAML

pytestmark = pytest.mark.timeout(90)

RPC_TIMEOUT_S = 2.0
PREFIX = "/tls-test/"
CLIENT = "fairshare"
"""The CN of the allocator's client certificate."""
ADMIN = "root"
"""The CN of the certificate etcdctl uses: etcd's root user once auth is on."""
TOKEN_TTL_S = 1
"""etcd's ``--auth-token-ttl`` in the auth tests: tokens expire while the test waits."""


class Pki:
    def __init__(self, directory: pathlib.Path) -> None:
        self.ca, self.server, clients = make_pki(directory, (CLIENT, ADMIN))
        self.client: Pair = clients[CLIENT]
        self.admin: Pair = clients[ADMIN]

    def access(self, *, client_cert: bool = True) -> EtcdAccess:
        return EtcdAccess(
            ca_pem=self.ca.cert.read_bytes(),
            cert_pem=self.client.cert.read_bytes() if client_cert else None,
            key_pem=self.client.key.read_bytes() if client_cert else None,
        )


@pytest.fixture
def pki(tmp_path: pathlib.Path) -> Pki:
    directory = tmp_path / "pki"
    directory.mkdir()
    return Pki(directory)


@pytest.fixture
def etcd_tls(pki: Pki) -> Iterator[EtcdProcess]:
    tls = EtcdTls(
        ca_file=pki.ca.cert,
        cert_file=pki.server.cert,
        key_file=pki.server.key,
        client_cert=(pki.admin.cert, pki.admin.key),
    )
    with EtcdProcess(name="tls-etcd", tls=tls) as etcd:
        yield etcd


@pytest.fixture
def etcd_auth() -> Iterator[EtcdProcess]:
    """A plaintext member whose users are root (password root-pw) and app (app-pw), auth
    on, tokens that expire after ``TOKEN_TTL_S`` unused."""
    with EtcdProcess(name="auth-etcd", auth_token_ttl_s=TOKEN_TTL_S) as etcd:
        for args in (
            ["user", "add", "root:root-pw"],
            ["user", "grant-role", "root", "root"],
            ["user", "add", "app:app-pw"],
            ["user", "grant-role", "app", "root"],
            ["auth", "enable"],
        ):
            etcd.etcdctl(*args)
        yield etcd


async def _round_trip(store: EtcdStore, key: str) -> None:
    lease = await store.grant_lease(5)
    created = await store.create(key, b"v", lease=lease)
    assert created is not None
    got = await store.get(key)
    assert got is not None and got.value == b"v"
    await store.revoke(lease)
    assert await store.get(key) is None


# -- TLS with client certificates -------------------------------------------------------


async def test_the_store_works_over_tls_with_a_client_certificate(
    etcd_tls: EtcdProcess, pki: Pki
) -> None:
    store = await connect([etcd_tls.client_url], rpc_timeout_s=RPC_TIMEOUT_S, access=pki.access())
    try:
        assert store.endpoints == (etcd_tls.client_url,)
        _, revision = await store.get_prefix(PREFIX)
        watch = store.watch_prefix(PREFIX, start_revision=revision)
        await _round_trip(store, PREFIX + "k")
        async with asyncio.timeout(RPC_TIMEOUT_S):
            event = await anext(watch)
        assert event.key == PREFIX + "k"
        await watch.aclose()
    finally:
        await store.close()


async def test_without_a_client_certificate_the_store_says_the_handshake_failed(
    etcd_tls: EtcdProcess, pki: Pki
) -> None:
    with pytest.raises(StoreUnavailable, match="TLS handshake") as failed:
        await connect(
            [etcd_tls.client_url],
            rpc_timeout_s=RPC_TIMEOUT_S,
            access=pki.access(client_cert=False),
        )
    assert etcd_tls.client_url in str(failed.value)


def _config(tmp_path: pathlib.Path, etcd: EtcdProcess, etcd_section: str) -> pathlib.Path:
    keys = tmp_path / "grant-keys"
    keys.write_text("ab" * 32 + "\n", encoding="utf-8")
    config = tmp_path / "pools.yaml"
    config.write_text(
        f"etcd:\n  endpoints: [{etcd.client_url}]\n  prefix: /tls-serve\n{etcd_section}"
        f"grants: {{key_file: {keys}}}\n{POOLS_YAML}",
        encoding="utf-8",
    )
    return config


def _serve_args(tmp_path: pathlib.Path, config: pathlib.Path, *extra: str) -> list[str]:
    state = tmp_path / "state"
    return serve_args(config, listen="127.0.0.1:0", node_id="tls-0", state_dir=state, extra=extra)


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")}


async def test_a_replica_serves_with_its_etcd_over_tls(
    etcd_tls: EtcdProcess, pki: Pki, tmp_path: pathlib.Path
) -> None:
    config = _config(tmp_path, etcd_tls, f"  ca_file: {pki.ca.cert}\n")
    # The client certificate from the environment, as the tls overlay gives it.
    environ = {
        **_environ(),
        "FAIRSHARE_ETCD_CERT_FILE": str(pki.client.cert),
        "FAIRSHARE_ETCD_KEY_FILE": str(pki.client.key),
    }
    replica = Allocator(tmp_path, config, node="tls-0", env=environ)
    replica.start()
    try:
        await wait_serving(replica.address, timeout_s=30, process=replica)
        # The replica campaigned through etcd: its owner keys are there.
        owners = etcd_tls.etcdctl("get", "--prefix", "--keys-only", "/tls-serve/")
        assert "/tls-serve/" in owners, owners
    finally:
        replica.stop()


def test_a_replica_without_its_client_certificate_exits_2_saying_the_handshake_failed(
    etcd_tls: EtcdProcess, pki: Pki, tmp_path: pathlib.Path
) -> None:
    config = _config(tmp_path, etcd_tls, "")
    args = _serve_args(tmp_path, config, "--etcd-ca-file", str(pki.ca.cert))
    done = run_serve(args, timeout_s=30, env=_environ())
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("fairshare:")]
    assert "TLS handshake" in line and etcd_tls.client_url in line, line


def test_https_endpoints_without_a_ca_exit_2_naming_the_key(
    tmp_path: pathlib.Path,
) -> None:
    config = tmp_path / "pools.yaml"
    keys = tmp_path / "grant-keys"
    keys.write_text("ab" * 32 + "\n", encoding="utf-8")
    config.write_text(
        f"etcd: {{endpoints: ['https://127.0.0.1:1']}}\ngrants: {{key_file: {keys}}}\n{POOLS_YAML}",
        encoding="utf-8",
    )
    done = run_serve(_serve_args(tmp_path, config), timeout_s=30, env=_environ())
    assert done.returncode == 2, done.stderr
    assert "etcd.ca_file" in done.stderr and "https://" in done.stderr, done.stderr


# -- username and password --------------------------------------------------------------


async def test_the_store_authenticates_and_renews_an_expired_token(
    etcd_auth: EtcdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ha.store.etcd")
    access = EtcdAccess(username="app", password="app-pw")
    store = await connect(etcd_auth.endpoints, rpc_timeout_s=RPC_TIMEOUT_S, access=access)
    try:
        await _round_trip(store, PREFIX + "a")
        _, revision = await store.get_prefix(PREFIX)
        # Unused for more than the TTL, the token expires: the next write (not
        # idempotent) and the next watch are refused it, then sent with a new one.
        await asyncio.sleep(TOKEN_TTL_S + 1.5)
        await store.put(PREFIX + "b", b"after expiry")
        renewals = [r for r in caplog.records if "authenticating again" in r.getMessage()]
        assert len(renewals) == 1, caplog.text
        await asyncio.sleep(TOKEN_TTL_S + 1.5)
        watch = store.watch_prefix(PREFIX, start_revision=revision)
        async with asyncio.timeout(RPC_TIMEOUT_S * 3):
            event = await anext(watch)
        assert event.key == PREFIX + "b"
        await watch.aclose()
        await _round_trip(store, PREFIX + "c")
        renewals = [r for r in caplog.records if "authenticating again" in r.getMessage()]
        assert len(renewals) == 2, caplog.text
    finally:
        await store.close()
    assert etcd_auth.etcdctl("--user=root:root-pw", "del", "--prefix", PREFIX)


async def test_a_wrong_password_is_refused_by_name(etcd_auth: EtcdProcess) -> None:
    access = EtcdAccess(username="app", password="not-the-password")
    with pytest.raises(StoreUnavailable, match=r"refused etcd\.username with etcd\.password_file"):
        await connect(etcd_auth.endpoints, rpc_timeout_s=RPC_TIMEOUT_S, access=access)


async def test_without_credentials_etcd_with_auth_denies_the_store(
    etcd_auth: EtcdProcess,
) -> None:
    with pytest.raises(StoreUnavailable, match=r"etcd\.username"):
        await connect(etcd_auth.endpoints, rpc_timeout_s=RPC_TIMEOUT_S)


async def test_without_a_username_auth_turned_on_fails_calls_without_renewing_a_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ha.store.etcd")
    with EtcdProcess(name="auth-later-etcd") as etcd:
        store = await connect(etcd.endpoints, rpc_timeout_s=RPC_TIMEOUT_S)
        try:
            await _round_trip(store, PREFIX + "a")
            for args in (
                ["user", "add", "root:root-pw"],
                ["user", "grant-role", "root", "root"],
                ["auth", "enable"],
            ):
                etcd.etcdctl(*args)
            # etcd now answers "user name is empty": no token was sent, none to renew.
            with pytest.raises(StoreUnavailable, match=r"set etcd\.username") as refused:
                await store.put(PREFIX + "b", b"after auth on")
            assert "user name is empty" in str(refused.value), refused.value
            assert "authenticating again" not in caplog.text, caplog.text
            assert "refused the auth token" not in caplog.text, caplog.text
        finally:
            await store.close()
        etcd.etcdctl("--user=root:root-pw", "del", "--prefix", PREFIX)


@pytest.mark.parametrize(
    ("username", "words", "renews"),
    [
        pytest.param("app", "invalid auth token", True, id="expired-token-with-username"),
        pytest.param("app", "user name is empty", True, id="no-token-with-username"),
        pytest.param(None, "user name is empty", False, id="no-token-no-username"),
        pytest.param(None, "invalid auth token", False, id="any-refusal-no-username"),
        pytest.param("app", "authentication failed", False, id="wrong-password"),
    ],
)
def test_a_refused_token_is_renewed_only_with_a_username(
    username: str | None, words: str, renews: bool
) -> None:
    password = None if username is None else "app-pw"
    access = EtcdAccess(username=username, password=password)
    connection = Connection(["http://127.0.0.1:2379"], rpc_timeout_s=1.0, access=access)
    assert connection.reauthenticates(translate_reason(f"etcdserver: {words}")) is renews


def test_a_replica_with_a_wrong_password_file_exits_2_saying_so(
    etcd_auth: EtcdProcess, tmp_path: pathlib.Path
) -> None:
    password = tmp_path / "etcd-password"
    password.write_text("wrong\n", encoding="utf-8")
    section = f"  username: app\n  password_file: {password}\n"
    config = _config(tmp_path, etcd_auth, section)
    done = run_serve(_serve_args(tmp_path, config), timeout_s=30, env=_environ())
    assert done.returncode == 2, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("fairshare:")]
    assert "etcd.password_file" in line, line
