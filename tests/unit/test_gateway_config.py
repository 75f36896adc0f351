"""fairshare.gateway.config: the keys of the issue, defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fairshare.gateway.config import ConfigError, load, parse
from harness.gateway import run_gateway_command

FULL = """
listen: 0.0.0.0:8080
metrics_listen: 0.0.0.0:9091
allocator:
  endpoints: ["allocator:50051"]
  holder: gateway-0
auth:
  keys_file: /etc/fairshare/keys.yaml
  team_header: x-fairshare-team
  class_header: x-fairshare-class
models:
  - name: llama-70b
    pool: gpu-a
    upstreams: ["http://vllm-0:8000", "http://vllm-1:8000/"]
    fallback:
      - pool: gpu-shared
        upstreams: ["http://vllm-shared-0:8000"]
cost:
  unit: tokens
  prompt_weight: 1.0
  completion_weight: 1.0
"""


def test_the_issue_example_reads_as_written() -> None:
    config = parse(yaml.safe_load(FULL))
    assert config.listen == "0.0.0.0:8080" and config.metrics_listen == "0.0.0.0:9091"
    assert config.allocator.endpoints == ("allocator:50051",)
    assert config.allocator.holder == "gateway-0"
    assert config.auth.team_header == "x-fairshare-team"
    assert config.auth.class_header == "x-fairshare-class"
    model = config.model("llama-70b")
    assert model is not None
    assert model.primary.pool == "gpu-a"
    assert model.primary.upstreams == ("http://vllm-0:8000", "http://vllm-1:8000")
    assert [(r.pool, r.upstreams) for r in model.fallback] == [
        ("gpu-shared", ("http://vllm-shared-0:8000",))
    ]
    assert (config.cost.unit, config.cost.prompt_weight) == ("tokens", 1.0)
    assert config.model("other") is None


def test_defaults() -> None:
    config = parse(
        {
            "allocator": {"endpoints": ["a:1"]},
            "models": [{"name": "m", "pool": "p", "upstreams": ["http://u:1"]}],
        }
    )
    assert config.listen == "0.0.0.0:8080" and config.metrics_listen == "0.0.0.0:9091"
    assert config.allocator.holder  # the host name
    assert config.cost.unit == "tokens" and config.redecide.enabled
    assert parse({**yaml.safe_load(FULL), "metrics_listen": ""}).metrics_listen == ""
    limits = config.limits
    assert (limits.upstream_connect_s, limits.upstream_first_byte_s) == (5.0, 300.0)
    assert limits.upstream_idle_s == 60.0
    assert (limits.header_timeout_s, limits.max_client_connections) == (10.0, 4096)
    assert limits.stored_responses == 10_000
    health = config.health
    assert (health.interval_s, health.timeout_s) == (5.0, 2.0)
    assert (health.unhealthy_after, health.eject_after) == (2, 5)


def test_timeouts_health_and_connections_read_as_written() -> None:
    config = parse(
        {
            **yaml.safe_load(FULL),
            "limits": {
                "upstream_connect_s": 1,
                "upstream_first_byte_s": 2.5,
                "upstream_idle_s": 3,
                "header_timeout_s": 0.5,
                "max_client_connections": 7,
            },
            "health": {"interval_s": 0.2, "timeout_s": 0.3, "unhealthy_after": 1, "eject_after": 9},
        }
    )
    limits, health = config.limits, config.health
    assert (limits.upstream_connect_s, limits.upstream_first_byte_s) == (1.0, 2.5)
    assert (limits.upstream_idle_s, limits.header_timeout_s) == (3.0, 0.5)
    assert limits.max_client_connections == 7
    assert (health.interval_s, health.timeout_s) == (0.2, 0.3)
    assert (health.unhealthy_after, health.eject_after) == (1, 9)


def test_auth_trusts_headers_from_loopback_unless_told() -> None:
    auth = parse(yaml.safe_load(FULL)).auth
    assert not auth.fairness_id
    assert [str(n) for n in auth.trusted_peers] == ["127.0.0.0/8", "::1/128"]
    told = {"fairness_id": True, "trusted_peers": ["10.0.0.0/8", "192.0.2.7", "fd00::/8"]}
    auth = parse({**yaml.safe_load(FULL), "auth": told}).auth
    assert auth.fairness_id and auth.any_source and auth.keys_file is None
    assert [str(n) for n in auth.trusted_peers] == ["10.0.0.0/8", "192.0.2.7/32", "fd00::/8"]
    nobody = parse({**yaml.safe_load(FULL), "auth": {"trusted_peers": []}}).auth
    assert nobody.trusted_peers == () and not nobody.any_source


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"listen": "nope"}, "listen"),
        ({"metrics_listen": "host:99999"}, "metrics_listen"),
        ({"allocator": {"holder": "x"}}, "allocator.endpoints"),
        ({"allocator": {"endpoints": []}}, "allocator.endpoints"),
        ({"allocator": {"endpoints": ["a:1"], "nope": 1}}, "allocator.nope"),
        ({"models": []}, "models"),
        ({"models": [{"name": "m", "pool": "p"}]}, "models[0].upstreams"),
        (
            {"models": [{"name": "m", "pool": "p", "upstreams": ["ftp://x"]}]},
            "models[0].upstreams[0]",
        ),
        (
            {"models": [{"name": "m", "pool": "p", "upstreams": ["http://x:1/v1"]}]},
            "models[0].upstreams[0]",
        ),
        (
            {
                "models": [
                    {"name": "m", "pool": "p", "upstreams": ["http://x:1"]},
                    {"name": "m", "pool": "q", "upstreams": ["http://x:1"]},
                ]
            },
            "models[1].name",
        ),
        (
            {
                "models": [
                    {
                        "name": "m",
                        "pool": "p",
                        "upstreams": ["http://x:1"],
                        "fallback": [{"pool": "q"}],
                    }
                ]
            },
            "models[0].fallback[0].upstreams",
        ),
        (
            {
                "models": [
                    {
                        "name": "m",
                        "pool": "p",
                        "upstreams": ["http://x:1"],
                        "fallback": [{"pool": "p", "upstreams": ["http://y:1"]}],
                    }
                ]
            },
            "models[0].fallback",
        ),
        (
            {"models": [{"name": "m", "pool": "p", "upstreams": ["http://x:1"], "routing": "x"}]},
            "models[0].routing",
        ),
        (
            {
                "models": [
                    {
                        "name": "m",
                        "pool": "p",
                        "upstreams": ["http://x:1"],
                        "fallback": [{"pool": "q", "upstreams": ["http://y:1"], "routing": 3}],
                    }
                ]
            },
            "models[0].fallback[0].routing",
        ),
        ({"cost": {"unit": "dollars"}}, "cost.unit"),
        ({"cost": {"prompt_weight": -1}}, "cost.prompt_weight"),
        ({"auth": {"team_header": "bad header"}}, "auth.team_header"),
        ({"auth": {"fairness_id": "yes"}}, "auth.fairness_id"),
        ({"auth": {"trusted_peers": "10.0.0.0/8"}}, "auth.trusted_peers"),
        ({"auth": {"trusted_peers": ["10.0.0.1/8"]}}, "auth.trusted_peers[0]"),
        ({"auth": {"trusted_peers": ["127.0.0.1", "proxy"]}}, "auth.trusted_peers[1]"),
        ({"limits": {"max_body_bytes": 0}}, "limits.max_body_bytes"),
        ({"limits": {"upstream_first_byte_s": 0}}, "limits.upstream_first_byte_s"),
        ({"limits": {"upstream_idle_s": "1m"}}, "limits.upstream_idle_s"),
        ({"limits": {"header_timeout_s": -1}}, "limits.header_timeout_s"),
        ({"limits": {"max_client_connections": 0}}, "limits.max_client_connections"),
        ({"limits": {"stored_responses": 0}}, "limits.stored_responses"),
        ({"limits": {"upstream_timeout_s": 600}}, "limits.upstream_timeout_s"),
        ({"health": {"interval_s": 0}}, "health.interval_s"),
        ({"health": {"unhealthy_after": 1.5}}, "health.unhealthy_after"),
        ({"health": {"path": "/ready"}}, "health.path"),
        ({"redecide": {"enabled": "yes"}}, "redecide.enabled"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_errors_name_the_key(change: dict[str, object], key: str) -> None:
    data = {**yaml.safe_load(FULL), **change}
    with pytest.raises(ConfigError) as raised:
        parse(data)
    assert str(raised.value).startswith(f"{key}:"), raised.value


def test_the_replaced_timeout_names_what_replaced_it() -> None:
    with pytest.raises(ConfigError, match=r"replaced by limits\.upstream_first_byte_s"):
        parse({**yaml.safe_load(FULL), "limits": {"upstream_timeout_s": 600}})


def test_routing_defaults_to_fewest_ahead_and_fallbacks_inherit_it() -> None:
    def model(**routing: str) -> dict[str, object]:
        return {
            "name": "m",
            "pool": "p",
            "upstreams": ["http://x:1"],
            "fallback": [
                {"pool": "q", "upstreams": ["http://y:1"]},
                {"pool": "r", "upstreams": ["http://z:1"], "routing": "random"},
            ],
            **routing,
        }

    allocator = {"endpoints": ["a:1"]}
    default = parse({"allocator": allocator, "models": [model()]}).models[0]
    assert [r.routing for r in (default.primary, *default.fallback)] == [
        "fewest-ahead",
        "fewest-ahead",
        "random",
    ]
    chosen = parse({"allocator": allocator, "models": [model(routing="round-robin")]}).models[0]
    assert [r.routing for r in (chosen.primary, *chosen.fallback)] == [
        "round-robin",
        "round-robin",
        "random",
    ]


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)


def test_the_command_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(FULL.replace("unit: tokens", "unit: euros"))
    done = run_gateway_command("--config", str(path))
    assert done.returncode == 2
    assert "cost.unit" in done.stderr


def test_the_command_exits_2_on_an_unknown_router(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "allocator": {"endpoints": ["a:1"]},
                "models": [
                    {"name": "m", "pool": "p", "upstreams": ["http://x:1"], "routing": "smart"}
                ],
            }
        )
    )
    done = run_gateway_command("--config", str(path))
    assert done.returncode == 2
    assert "models[0].routing" in done.stderr and "fewest-ahead" in done.stderr
