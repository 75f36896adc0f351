"""The gateway's Kubernetes manifests (deploy/gateway/) agree with themselves and the allocator.

Offline, as tests/unit/test_deploy.py: kustomize renders through ``kubectl kustomize``
(client side only), objects are checked against the schemas bundled with
``kubernetes-validate`` with sockets blocked. What is shared with the allocator's
manifests (locked-down pods, DNS in every egress policy, selectors that select a pod,
every file listed by its kustomization) is checked there, over every kustomization.

The configuration is checked for the keys of the gateway's configuration block (issue
18) and, where the ``gateway`` package is installed, loaded with its own parser.
"""

from __future__ import annotations

import functools
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes_validate import utils as kv

from harness.kubectl import kustomize

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "fairshare"
CONFIG_PATH = "/etc/fairshare/gateway.yaml"
K8S_VERSIONS = ["1.29.0", kv.latest_version()]

# The configuration keys of the gateway (docs/gateway.md): the manifests use no others.
KEYS: dict[str, set[str]] = {
    "": {"listen", "metrics_listen", "allocator", "auth", "models", "cost"},
    "allocator": {"endpoints", "holder", "tls"},
    "allocator.tls": {"ca_file", "cert_file", "key_file"},
    "auth": {"keys_file", "team_header", "class_header", "fairness_id", "trusted_peers"},
    "models[]": {"name", "pool", "upstreams", "fallback"},
    "models[].fallback[]": {"pool", "upstreams"},
    "cost": {"unit", "prompt_weight", "completion_weight"},
}
SHUTDOWN_GRACE_S = 30.0
"""The gateway's default ``limits.shutdown_grace_s`` (docs/gateway.md)."""
EXIT_SAFETY_S = 10.0
"""After the streams: every grant released, the client library's releases flushed."""

Manifest = dict[str, Any]


@functools.cache
def _rendered(target: str) -> tuple[Manifest, ...]:
    return tuple(doc for doc in yaml.safe_load_all(kustomize(DEPLOY / target)) if doc)


def _find(objects: tuple[Manifest, ...], kind: str, name: str) -> Manifest:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _gateway() -> tuple[Manifest, ...]:
    return _rendered("gateway")


def _deployment() -> Manifest:
    return _find(_gateway(), "Deployment", "gateway")


def _container() -> Manifest:
    (container,) = _deployment()["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _config_map() -> Manifest:
    (cm,) = [o for o in _gateway() if o["kind"] == "ConfigMap"]
    return cm


def _config() -> dict[str, Any]:
    doc = yaml.safe_load(_config_map()["data"]["gateway.yaml"])
    assert isinstance(doc, dict)
    return doc


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _container_ports() -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in _container()["ports"]}


def _policy_ports(policy: Manifest, direction: str) -> list[tuple[Manifest, set[int]]]:
    """Each rule of an ingress or egress policy: its peers' first entry and its ports."""
    peers = "from" if direction == "ingress" else "to"
    return [(r[peers][0], {p["port"] for p in r["ports"]}) for r in policy["spec"][direction]]


def test_rendered_gateway_is_valid_strictly() -> None:
    objects = _gateway()
    assert {o["kind"] for o in objects} == {
        "Deployment",
        "Service",
        "ConfigMap",
        "Secret",
        "NetworkPolicy",
        "PodDisruptionBudget",
    }
    with pytest.MonkeyPatch.context() as m:
        m.setattr(socket.socket, "connect", lambda *a: pytest.fail("network access attempted"))
        for version in K8S_VERSIONS:
            for doc in objects:
                try:
                    kv.validate(doc, version, strict=True)
                except kv.ValidationError as e:
                    where = ".".join(str(p) for p in e.path)
                    pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} ({version}): {where}")
    for o in objects:
        assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]["name"]


def _check_keys(where: str, value: object) -> None:
    assert isinstance(value, dict), where
    assert set(value) <= KEYS[where], f"{where or 'top level'}: {set(value) - KEYS[where]}"


def test_config_uses_only_the_gateways_keys() -> None:
    cfg = _config()
    _check_keys("", cfg)
    _check_keys("allocator", cfg["allocator"])
    if "tls" in cfg["allocator"]:
        _check_keys("allocator.tls", cfg["allocator"]["tls"])
    _check_keys("auth", cfg["auth"])
    _check_keys("cost", cfg["cost"])
    assert cfg["models"]
    for model in cfg["models"]:
        _check_keys("models[]", model)
        for fallback in model.get("fallback", []):
            _check_keys("models[].fallback[]", fallback)
    # Every replica must be a holder of its own: no shared holder in a Deployment's config.
    assert "holder" not in cfg["allocator"]


def test_config_loads_with_the_gateways_parser() -> None:
    config = pytest.importorskip("fairshare.gateway.config")
    parsed = config.parse(_config())
    assert parsed.listen == _config()["listen"]


def test_models_name_pools_of_the_allocator() -> None:
    doc = yaml.safe_load((DEPLOY / "base" / "pools.yaml").read_text())
    pools = {p["name"] for p in doc["pools"]}
    for model in _config()["models"]:
        named = {model["pool"], *(f["pool"] for f in model.get("fallback", []))}
        assert named <= pools, f"{model['name']}: {named - pools} not in deploy/base/pools.yaml"


def test_container_runs_the_gateway_command_with_its_config_mounted() -> None:
    container = _container()
    assert container["args"] == ["gateway", "--config", CONFIG_PATH]
    sts = _find(_rendered(""), "StatefulSet", "allocator")
    (allocator,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["image"] == allocator["image"], "the same image as the allocators"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == CONFIG_PATH]
    volumes = {v["name"]: v for v in _deployment()["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == _config_map()["metadata"]["name"]
    assert mount["subPath"] in _config_map()["data"]


def test_keys_file_is_a_secret_mounted_as_a_directory() -> None:
    """Only a directory mount follows a replaced Secret, which the gateway re-reads."""
    keys_file = Path(_config()["auth"]["keys_file"])
    container = _container()
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(keys_file.parent)]
    assert "subPath" not in mount
    volumes = {v["name"]: v for v in _deployment()["spec"]["template"]["spec"]["volumes"]}
    secret = volumes[mount["name"]]["secret"]
    assert [i["path"] for i in secret["items"]] == [keys_file.name]
    rendered = _find(_gateway(), "Secret", secret["secretName"])
    assert {i["key"] for i in secret["items"]} <= rendered["data"].keys()
    # The placeholder holds no key: deployed unchanged, it lets nobody in.
    placeholder = yaml.safe_load((DEPLOY / "gateway" / "keys.yaml").read_text())
    assert placeholder == {"keys": {}}


def test_ports_agree_with_the_config_probes_service_and_policy() -> None:
    cfg = _config()
    ports = _container_ports()
    assert ports == {"http": _port(cfg["listen"]), "metrics": _port(cfg["metrics_listen"])}
    assert (ports["http"], ports["metrics"]) == (8080, 9091)
    container = _container()
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    annotations = _deployment()["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    service = _find(_gateway(), "Service", "gateway")
    assert {p["targetPort"]: p["port"] for p in service["spec"]["ports"]} == ports
    ingress = _find(_gateway(), "NetworkPolicy", "gateway-ingress")
    assert [p for _, p in _policy_ports(ingress, "ingress")] == [
        {ports["http"]},
        {ports["metrics"]},
    ]


def test_allocator_endpoints_reach_the_allocator_service() -> None:
    base = _rendered("")
    service = _find(base, "Service", "allocator")
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    domain = _find(base, "ConfigMap", _configmap_name(base, "fairshare-cluster"))["data"]
    for endpoint in _config()["allocator"]["endpoints"]:
        host, _, port = endpoint.rpartition(":")
        assert host == f"allocator.{NAMESPACE}.svc.{domain['domain']}", endpoint
        assert int(port) == grpc["port"]
    # The allocators admit the gateway pods, and the gateways may reach the allocators.
    labels = _deployment()["spec"]["template"]["metadata"]["labels"]
    admitted = _find(base, "NetworkPolicy", "allocator-ingress")
    assert any(
        peer.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
        and grpc["port"] in ports
        for peer, ports in _policy_ports(admitted, "ingress")
    )
    allocator_labels = _find(base, "StatefulSet", "allocator")["spec"]["template"]["metadata"]
    egress = _find(_gateway(), "NetworkPolicy", "gateway-egress")
    assert any(
        peer.get("podSelector", {}).get("matchLabels", {}).items()
        <= allocator_labels["labels"].items()
        and grpc["port"] in ports
        for peer, ports in _policy_ports(egress, "egress")
    )


def _configmap_name(objects: tuple[Manifest, ...], prefix: str) -> str:
    (name,) = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix)
    ]
    return str(name)


def test_egress_admits_every_upstream_port() -> None:
    egress = _find(_gateway(), "NetworkPolicy", "gateway-egress")
    (vllm_ports,) = [
        ports
        for peer, ports in _policy_ports(egress, "egress")
        if peer.get("podSelector", {}).get("matchLabels") == {"app.kubernetes.io/name": "vllm"}
    ]
    for model in _config()["models"]:
        routes = [model, *model.get("fallback", [])]
        for url in (u for r in routes for u in r["upstreams"]):
            assert urlsplit(url).port in vllm_ports, url


def test_grace_period_lets_streams_finish() -> None:
    """preStop sleep, then SIGTERM: streams run on up to shutdown_grace_s, then exit."""
    pod = _deployment()["spec"]["template"]["spec"]
    grace = _config().get("limits", {}).get("shutdown_grace_s", SHUTDOWN_GRACE_S)
    sleep = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] >= float(sleep[1]) + grace + EXIT_SAFETY_S
    strategy = _deployment()["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0, "never below the replicas asked"


def test_probes_leave_the_gateway_its_own_times() -> None:
    """/readyz asks the allocator for at most READY_PROBE_S, under the probe's timeout; the
    port opens after the pools' check at start, within the liveness probe's patience."""
    app = pytest.importorskip("fairshare.gateway.app")
    container = _container()
    ready, live = container["readinessProbe"], container["livenessProbe"]
    assert ready["timeoutSeconds"] > app.READY_PROBE_S
    assert live["timeoutSeconds"] > app.READY_PROBE_S
    assert live["periodSeconds"] * live["failureThreshold"] > 3 * app.POOLS_AT_START_S
