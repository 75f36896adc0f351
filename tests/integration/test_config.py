"""The configuration loader: precedence, and refusals that name the offending key."""

from __future__ import annotations

import pathlib

import pytest

from ha.settings import MIN_HELD, ConfigError, DegradedMode, PoolConfig, WaitEnd
from server.config import load_config

pytestmark = pytest.mark.timeout(10)

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "pools.yaml"


LENDING_REFUSALS = [
    ("lend: {team-a: 1.5}", "pools[0].lend.team-a", "lend-above-1"),
    ("lend: {team-a: -0.5}", "pools[0].lend.team-a", "lend-negative"),
    ("lend: {team-a: half}", "pools[0].lend.team-a", "lend-not-number"),
    ("lend: 0.5", "pools[0].lend", "lend-scalar"),
    ("on_wait_end: queue", "pools[0].on_wait_end", "wait-end"),
    ("max_held: -1", "pools[0].max_held", "max-held-negative"),
    ("max_held: 2.5", "pools[0].max_held", "max-held-float"),
]
"""(a pool key as YAML, the path its refusal names, the case's id)"""


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "pools.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_loads_with_defaults() -> None:
    config = load_config(EXAMPLE, environ={})
    assert [p.name for p in config.pools] == ["gpu-a", "gpu-b"]
    assert config.pools[0].shares == {"inst-a": 0.8125, "inst-b": 0.1875}
    assert config.pools[1].degraded_mode is DegradedMode.FAIL_CLOSED
    assert config.listen == "127.0.0.1:50051"
    assert config.advertise == config.listen
    assert config.metrics_listen == "127.0.0.1:9090"
    assert config.etcd.embedded
    assert config.etcd.prefix == "/fairshare"
    assert config.timing.lease_ttl_s == 5.0


def test_lending_keys_load_and_default(tmp_path: pathlib.Path) -> None:
    text = (
        "pools:\n"
        "  - {name: a, capacity: 100, shares: {t: 0.5, u: 0.5}, lend: {t: 0.25, v: 0},\n"
        "     on_wait_end: refuse, max_held: 0}\n"
        "  - {name: b, capacity: 100, shares: {t: 1}}\n"
    )
    lent, plain = load_config(write(tmp_path, text), environ={}).pools
    assert lent.lend == {"t": 0.25, "v": 0.0}
    assert lent.on_wait_end is WaitEnd.REFUSE
    assert (lent.max_held, lent.held_bound(100)) == (0, 0)
    assert plain.lend == {}
    assert plain.on_wait_end is WaitEnd.BORROW
    assert plain.max_held is None
    assert plain.held_bound(100) == 400  # 4 x C
    assert plain.held_bound(2) == MIN_HELD


@pytest.mark.parametrize(
    ("config", "path"),
    [
        pytest.param(PoolConfig("p", 1, lend={"t": 2.0}), "pool.lend", id="lend"),
        pytest.param(PoolConfig("p", 1, on_wait_end="refuse"), "pool.on_wait_end", id="mode"),  # type: ignore[arg-type]
        pytest.param(PoolConfig("p", 1, max_held=True), "pool.max_held", id="held-bool"),
    ],
)
def test_pool_config_validates_the_lending_keys(config: PoolConfig, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert info.value.path == path


def test_precedence_defaults_file_env_overrides(tmp_path: pathlib.Path) -> None:
    path = write(
        tmp_path,
        "listen: 127.0.0.1:1000\nmetrics_listen: 127.0.0.1:1001\nnode_id: file\n"
        "timing: {lease_ttl_s: 6}\npools: []\n",
    )
    keys = tmp_path / "grant-keys"
    keys.write_text("k" * 40 + "\n", encoding="utf-8")
    env = {
        "FAIRSHARE_GRANTS_KEY_FILE": str(keys),
        "FAIRSHARE_LISTEN": "127.0.0.1:2000",
        "FAIRSHARE_NODE_ID": "env",
        "FAIRSHARE_LEASE_TTL_S": "9",
        "FAIRSHARE_ETCD_ENDPOINTS": "http://a:2379, b:2379",
        "FAIRSHARE_PORT_50051_TCP": "tcp://10.0.0.1:50051",  # Kubernetes noise: ignored
    }
    config = load_config(
        path, environ=env, overrides={"listen": "127.0.0.1:3000", "state_dir": None}
    )
    assert config.listen == "127.0.0.1:3000"
    assert config.advertise == "127.0.0.1:3000"
    assert config.metrics_listen == "127.0.0.1:1001"
    assert config.node_id == "env"
    assert config.timing.lease_ttl_s == 9.0
    assert config.etcd.endpoints == ("http://a:2379", "b:2379")
    assert not config.etcd.embedded
    assert config.grants.key_file == str(keys)


def test_empty_metrics_listen_disables_metrics() -> None:
    config = load_config(None, environ={"FAIRSHARE_METRICS_LISTEN": ""})
    assert config.metrics_listen == ""


@pytest.mark.parametrize(
    ("text", "env", "path"),
    [
        pytest.param("bogus: 1\n", {}, "bogus", id="unknown-top-key"),
        pytest.param("etcd: {endpoint: [a]}\n", {}, "etcd.endpoint", id="unknown-etcd-key"),
        pytest.param(
            "pools: [{name: a, capacity: 1}, {name: b, capacity: 2, shares: {team-a: -1}}]\n",
            {},
            "pools[1].shares.team-a",
            id="negative-share",
        ),
        pytest.param(
            "pools: [{name: a, capacity: 1, shares: {t: .nan}}]\n",
            {},
            "pools[0].shares.t",
            id="nan",
        ),
        pytest.param("pools: [{name: a, capacity: 1.5}]\n", {}, "pools[0].capacity", id="float-c"),
        pytest.param("pools: [{name: a, capacity: -1}]\n", {}, "pools[0].capacity", id="neg-c"),
        pytest.param("pools: [{capacity: 1}]\n", {}, "pools[0].name", id="no-name"),
        pytest.param(
            "pools: [{name: a, capacity: 1}, {name: a, capacity: 1}]\n",
            {},
            "pools[1].name",
            id="duplicate",
        ),
        pytest.param(
            "pools: [{name: a, capacity: 1, colour: red}]\n", {}, "pools[0].colour", id="pool-key"
        ),
        pytest.param(
            "pools: [{name: a, capacity: 1, degraded_mode: maybe}]\n",
            {},
            "pools[0].degraded_mode",
            id="mode",
        ),
        *[
            pytest.param(f"pools: [{{name: a, capacity: 1, {key}}}]\n", {}, path, id=name)
            for key, path, name in LENDING_REFUSALS
        ],
        pytest.param(
            "etcd: {endpoints: [a:2379]}\n", {}, "grants.key_file", id="replicated-no-key"
        ),
        pytest.param(
            "grants: {key_file: /nonexistent/grant-keys}\n", {}, "grants.key_file", id="no-key-file"
        ),
        pytest.param(
            "pools: [{name: a, capacity: 1, max_charge_per_s: 0}]\n",
            {},
            "pools[0].max_charge_per_s",
            id="max-charge",
        ),
        pytest.param(
            "pools: [{name: a, capacity: 1, max_request_s: 0}]\n",
            {},
            "pools[0].max_request_s",
            id="max-request",
        ),
        pytest.param(
            "pools: [{name: a, capacity: 1, max_request_s: 7200}]\n",
            {},
            "timing.release_memory_s",
            id="release-memory-rule",
        ),
        pytest.param(
            "timing: {snapshot_interval_s: 4}\n", {}, "timing.snapshot_interval_s", id="t"
        ),
        pytest.param(
            "timing: {release_commit_s: -0.001}\n", {}, "timing.release_commit_s", id="neg-lazy"
        ),
        pytest.param(
            "", {"FAIRSHARE_COMMIT_WINDOW_S": "-1"}, "timing.commit_window_s", id="neg-window"
        ),
        pytest.param("", {"FAIRSHARE_LEASE_TTL_S": "soon"}, "timing.lease_ttl_s", id="env-nan"),
        pytest.param(
            "timing: {rebalance_settle_s: -1}\n", {}, "timing.rebalance_settle_s", id="neg-settle"
        ),
        pytest.param(
            "",
            {"FAIRSHARE_REBALANCE_SETTLE_S": "inf"},
            "timing.rebalance_settle_s",
            id="inf-settle",
        ),
        pytest.param(
            "",
            {"FAIRSHARE_KEEPALIVE_INTERVAL_S": "3"},
            "timing.keepalive_interval_s",
            id="env-rule",
        ),
        pytest.param(
            "timing: {session_ttl_s: 5}\n", {}, "timing.session_ttl_s", id="session-ttl-rule"
        ),
        pytest.param(
            "timing: {session_ttl_s: 1.2, forward_deadline_s: 0.4, snapshot_interval_s: 0.5}\n",
            {},
            "timing.session_ttl_s",
            id="session-ttl-tick",
        ),
        pytest.param("", {"FAIRSHARE_LISTEN": "nowhere"}, "listen", id="env-listen"),
        pytest.param("", {"FAIRSHARE_LOG_LEVEL": "loud"}, "log_level", id="env-level"),
        pytest.param("tls: {cert_file: /nonexistent.pem}\n", {}, "tls.cert_file", id="no-cert"),
        pytest.param("admin: {token_file: /nonexistent}\n", {}, "admin.token_file", id="no-token"),
        pytest.param("pools: {a: 1}\n", {}, "pools", id="pools-not-list"),
        pytest.param("- 1\n", {}, "config", id="not-mapping"),
        pytest.param("a: [\n", {}, "config", id="bad-yaml"),
    ],
)
def test_refusals_name_the_key(
    tmp_path: pathlib.Path, text: str, env: dict[str, str], path: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ=env)
    assert info.value.path == path, str(info.value)
    assert str(info.value).startswith(path)


def test_env_errors_say_where_the_value_came_from(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="FAIRSHARE_LISTEN"):
        load_config(None, environ={"FAIRSHARE_LISTEN": "nowhere"})


def test_unknown_override_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={}, overrides={"colour": "red"})
    assert info.value.path == "colour"


def test_missing_file_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.yaml", environ={})
    assert info.value.path == "config"


def test_tls_pairs(tmp_path: pathlib.Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, f"tls: {{cert_file: {cert}}}\n"), environ={})
    assert info.value.path == "tls.key_file"
    with pytest.raises(ConfigError) as info:
        load_config(
            write(
                tmp_path, f"tls: {{cert_file: {cert}, key_file: {cert}, admin_identities: [a]}}\n"
            ),
            environ={},
        )
    assert info.value.path == "tls.admin_identities"


_PEM = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    ("section", "path"),
    [
        pytest.param("endpoints: ['https://a:2379']", "etcd.ca_file", id="https-without-ca"),
        pytest.param(
            "endpoints: ['https://a:2379', 'http://b:2379'], ca_file: {f}",
            "etcd.endpoints",
            id="mixed-schemes",
        ),
        pytest.param("endpoints: ['http://a:2379'], ca_file: {f}", "etcd.ca_file", id="ca-http"),
        pytest.param(
            "endpoints: ['https://a:2379'], ca_file: {f}, cert_file: {f}",
            "etcd.key_file",
            id="cert-without-key",
        ),
        pytest.param(
            "endpoints: ['https://a:2379'], ca_file: {f}, key_file: {f}",
            "etcd.cert_file",
            id="key-without-cert",
        ),
        pytest.param(
            "endpoints: ['http://a:2379'], username: app", "etcd.password_file", id="no-password"
        ),
        pytest.param(
            "endpoints: ['http://a:2379'], password_file: {f}", "etcd.username", id="no-user"
        ),
        pytest.param(
            "endpoints: ['https://a:2379'], ca_file: /nonexistent/ca.crt",
            "etcd.ca_file",
            id="no-ca-file",
        ),
        pytest.param("username: app, password_file: {f}", "etcd.username", id="auth-embedded"),
    ],
)
def test_etcd_tls_and_auth_refusals_name_the_key(
    tmp_path: pathlib.Path, section: str, path: str
) -> None:
    pem = tmp_path / "file.pem"
    pem.write_text(_PEM, encoding="utf-8")
    keys = tmp_path / "grant-keys"
    keys.write_text("ab" * 32 + "\n", encoding="utf-8")
    text = f"etcd: {{{section.format(f=pem)}}}\ngrants: {{key_file: {keys}}}\n"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert info.value.path == path, str(info.value)


def test_etcd_tls_and_auth_settings_load_from_file_and_environment(
    tmp_path: pathlib.Path,
) -> None:
    pem = tmp_path / "file.pem"
    pem.write_text(_PEM, encoding="utf-8")
    keys = tmp_path / "grant-keys"
    keys.write_text("ab" * 32 + "\n", encoding="utf-8")
    text = f"etcd: {{endpoints: ['https://a:2379'], ca_file: {pem}}}\n"
    environ = {
        "FAIRSHARE_GRANTS_KEY_FILE": str(keys),
        "FAIRSHARE_ETCD_CERT_FILE": str(pem),
        "FAIRSHARE_ETCD_KEY_FILE": str(pem),
        "FAIRSHARE_ETCD_USERNAME": "app",
        "FAIRSHARE_ETCD_PASSWORD_FILE": str(pem),
    }
    etcd = load_config(write(tmp_path, text), environ=environ).etcd
    assert etcd.ca_file == etcd.cert_file == etcd.key_file == etcd.password_file == str(pem)
    assert etcd.username == "app"
