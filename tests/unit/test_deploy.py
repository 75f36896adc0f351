"""The Kubernetes deployment (deploy/) and the image (Dockerfile) agree with the server.

Everything here is offline: manifests are checked against the JSON schemas bundled with
``kubernetes-validate`` (with sockets blocked, so a schema that would be fetched fails the
test), the pools config is loaded with the server's own loader, and kustomize renders
through ``kubectl kustomize`` (client side only, no cluster), with the virtualenv's kubectl
(``harness.kubectl``), never one on PATH.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import shlex
import socket
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from harness.kubectl import kustomize
from server import app
from server import config as server_config
from server.config import load_config
from server.metrics import HEALTHZ_PATH, LIVENESS_TIMEOUT_S

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "fairshare"
ALLOCATOR = "allocator"
CONFIG_MOUNT = "/etc/fairshare/pools.yaml"

# The oldest Kubernetes the manifests support, and the newest the validator knows.
K8S_VERSIONS = ["1.29.0", kv.latest_version()]
# Every kustomize target an operator applies: the default and each overlay.
TARGETS = ["", "overlays/external-etcd", "overlays/tls", "overlays/renamed"]
# The targets that deploy the bundled etcd beside the allocators.
ETCD_TARGETS = ["", "overlays/tls", "overlays/renamed"]
# Custom resources the validator has no schema for (components/podmonitor and
# observability bring them); test_podmonitors_scrape_the_metrics_ports and
# tests/unit/test_observability.py check them instead.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
# Secrets the operator creates (docs/deploy.md, "First install"); never in deploy/.
OPERATOR_SECRETS = {"fairshare-admin", "fairshare-grant-keys"}
TLS_SECRETS = {"fairshare-tls", "etcd-tls", "etcd-client-tls"}

Manifest = dict[str, Any]


# -- reading deploy/ ----------------------------------------------------------------------


def _load_all(path: Path) -> list[Manifest]:
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


@dataclasses.dataclass(frozen=True)
class Kustomization:
    """One kustomization.yaml and the files it names, by role."""

    directory: Path
    resources: tuple[Path, ...]
    bases: tuple[Path, ...]
    patches: tuple[Path, ...]
    generated: tuple[Path, ...]
    doc: Manifest


def _kustomization(directory: Path) -> Kustomization:
    doc = _load_all(directory / "kustomization.yaml")[0]
    entries = [directory / r for r in doc.get("resources", []) + doc.get("components", [])]
    return Kustomization(
        directory=directory,
        resources=tuple(p for p in entries if not p.is_dir()),
        bases=tuple(p.resolve() for p in entries if p.is_dir()),
        patches=tuple(directory / p["path"] for p in doc.get("patches", [])),
        generated=tuple(
            directory / f.rpartition("=")[2]
            for gen in doc.get("configMapGenerator", []) + doc.get("secretGenerator", [])
            for f in gen.get("files", [])
        ),
        doc=doc,
    )


def _kustomizations() -> list[Kustomization]:
    return [_kustomization(k.parent) for k in sorted(DEPLOY.rglob("kustomization.yaml"))]


def _manifest_files() -> list[Path]:
    """Every file a kustomization lists as a resource: complete Kubernetes objects."""
    return sorted(p for k in _kustomizations() for p in k.resources)


def _objects() -> list[Manifest]:
    """The objects of the default deployment, as written (before kustomize)."""
    return [doc for k in _kustomizations() if "overlays" not in k.directory.parts
            for p in k.resources for doc in _load_all(p)]  # fmt: skip


def _find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _workload(objects: list[Manifest], kind: str, name: str) -> Manifest:
    """The one object of ``kind`` named ``name``, or ``<prefix>-name`` in a renamed target."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and (o["metadata"]["name"] == name or o["metadata"]["name"].endswith(f"-{name}"))
    ]
    assert len(found) == 1, f"expected one {kind} named like {name}, found {len(found)}"
    return found[0]


def _container(statefulset: Manifest, name: str) -> Manifest:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def _expand_env(
    env: list[Manifest],
    fields: Mapping[str, str],
    configmaps: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The environment Kubernetes gives the container (``$(VAR)`` expanded in order).

    ``fields`` are the downward API's values, ``configmaps`` the data of the ConfigMaps a
    ``configMapKeyRef`` may name (by their rendered names): a reference to another fails.
    """
    result: dict[str, str] = {}
    for item in env:
        source = item.get("valueFrom")
        if source is not None and "fieldRef" in source:
            result[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
            continue
        if source is not None:
            ref = source["configMapKeyRef"]
            data = (configmaps or {}).get(ref["name"])
            assert data is not None, f"{item['name']}: no ConfigMap {ref['name']}"
            assert ref["key"] in data, (
                f"{item['name']}: ConfigMap {ref['name']} has no {ref['key']}"
            )
            result[item["name"]] = data[ref["key"]]
            continue
        result[item["name"]] = re.sub(
            r"\$\((\w+)\)", lambda m: result.get(m.group(1), m.group(0)), item["value"]
        )
    return result


POD_FIELDS = {"metadata.name": f"{ALLOCATOR}-0", "metadata.namespace": NAMESPACE}


def _pod_spec(workload: Manifest) -> Manifest:
    """The pod template's spec of a StatefulSet or a CronJob."""
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return workload["spec"]["template"]["spec"]


def _pod_containers(workload: Manifest) -> list[Manifest]:
    spec = _pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def _pod_env(
    objects: list[Manifest], workload: Manifest, container: str, ordinal: int = 0
) -> dict[str, str]:
    """A container's environment in pod ``ordinal`` of a rendered StatefulSet (or in a
    CronJob's pod), ConfigMap references resolved against ``objects``."""
    meta = workload["metadata"]
    pod = f"{meta['name']}-{ordinal}"
    if workload["kind"] == "CronJob":
        pod = f"{meta['name']}-29000000-x1y2z"
    fields = {"metadata.name": pod, "metadata.namespace": meta["namespace"]}
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects
                  if o["kind"] == "ConfigMap"}  # fmt: skip
    (c,) = [c for c in _pod_containers(workload) if c["name"] == container]
    return _expand_env(c.get("env", []), fields, configmaps)


def _pools_yaml() -> Path:
    base = _kustomization(DEPLOY / "base")
    (generator,) = [g for g in base.doc["configMapGenerator"] if g["name"] == "allocator-config"]
    (file,) = generator["files"]
    return base.directory / file


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


# -- rendering with kustomize ---------------------------------------------------------------


def _render(target: str) -> list[Manifest]:
    """The objects ``kubectl kustomize deploy/<target>`` renders (a fresh copy each call)."""
    return copy.deepcopy(_rendered(target))


@functools.cache
def _rendered(target: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(kustomize(DEPLOY / target)) if doc]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any attempt to reach the network fails the test that uses this fixture."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield


def _validate(doc: Manifest, version: str) -> None:
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        return
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as e:
        where = ".".join(str(p) for p in e.path)
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        pytest.fail(f"{name} is not valid for Kubernetes {version}: {where}: {e.message}")
    except kv.SchemaNotFoundError as e:
        # The command line only warns here; an unknown kind or apiVersion is an error.
        pytest.fail(e.message)


# -- kustomize layout -----------------------------------------------------------------------


def test_every_file_in_deploy_is_listed_by_its_kustomization() -> None:
    for k in _kustomizations():
        listed = {*k.resources, *k.patches, *k.generated}
        for path in listed:
            assert path.is_file(), f"{path.relative_to(REPO)} is listed but does not exist"
        present = {
            p
            for p in k.directory.iterdir()
            if p.is_file() and p.name != "kustomization.yaml" and not p.name.startswith(".")
        }
        where = k.directory.relative_to(REPO)
        assert present - listed == set(), f"{where}: files no kustomization lists"
        for base in k.bases:
            assert (base / "kustomization.yaml").is_file(), f"{where}: {base} is no kustomization"
    # Every directory with files belongs to a kustomization.
    for directory in {p.parent for p in DEPLOY.rglob("*") if p.is_file()}:
        assert (directory / "kustomization.yaml").is_file(), f"{directory} has no kustomization"


def test_default_target_deploys_the_allocator_and_etcd() -> None:
    top = _kustomization(DEPLOY)
    assert set(top.bases) == {(DEPLOY / "base").resolve(), (DEPLOY / "etcd").resolve()}
    ext = _kustomization(DEPLOY / "overlays" / "external-etcd")
    assert ext.bases == ((DEPLOY / "base").resolve(),), "external etcd must not deploy etcd"


CLUSTER_SCOPED = {"Namespace", "PriorityClass"}


def test_every_object_is_in_the_namespace_the_deployment_creates() -> None:
    objects = _objects()
    assert _find(objects, "Namespace", NAMESPACE)
    for o in objects:
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"].get("namespace") == NAMESPACE, o["metadata"]["name"]
        else:
            assert "namespace" not in o["metadata"], o["metadata"]["name"]
    for gen in _kustomization(DEPLOY / "base").doc["configMapGenerator"]:
        assert gen["namespace"] == NAMESPACE


# -- schema validation ----------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "path", _manifest_files(), ids=[str(p.relative_to(DEPLOY)) for p in _manifest_files()]
)
def test_manifest_is_valid_strictly(path: Path, version: str, offline: None) -> None:
    docs = _load_all(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        _validate(doc, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("target", TARGETS, ids=[t or "default" for t in TARGETS])
def test_rendered_target_is_valid_strictly(target: str, version: str) -> None:
    objects = _render(target)
    assert objects
    with pytest.MonkeyPatch.context() as m:
        m.setattr(socket.socket, "connect", lambda *a: pytest.fail("network access attempted"))
        for doc in objects:
            _validate(doc, version)


def test_validator_rejects_unknown_fields_offline(offline: None) -> None:
    """Guards the guard: strict mode and the bundled schemas are really in use."""
    assert K8S_VERSIONS[-1] >= "1.29", K8S_VERSIONS
    doc = _find(_objects(), "PodDisruptionBudget", ALLOCATOR)
    bad = {**doc, "spec": {**doc["spec"], "maxUnavailabe": 1}}
    for version in K8S_VERSIONS:
        with pytest.raises(kv.ValidationError):
            kv.validate(bad, version, strict=True)


# -- the server's view: config, env, flags, ports --------------------------------------------


def _materialise_files(
    tmp_path: Path, env: dict[str, str]
) -> tuple[Path, dict[str, str], set[str]]:
    """The config file and environment with every in-pod file path made to exist locally.

    The loader checks that TLS and token files exist. Returns the local config file, the
    environment with local paths, and the in-pod paths that were replaced.
    """
    doc = yaml.safe_load(_pools_yaml().read_text(encoding="utf-8"))
    replaced: set[str] = set()

    def make(path: str) -> str:
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x\n", encoding="utf-8")
        replaced.add(path)
        return str(target)

    for section in ("admin", "tls", "grants"):
        for key, value in (doc.get(section) or {}).items():
            if key.endswith("_file") and isinstance(value, str) and value.startswith("/"):
                doc[section][key] = make(value)
    env = {
        name: make(value) if name.endswith("_FILE") and value.startswith("/") else value
        for name, value in env.items()
    }
    config = tmp_path / "pools.yaml"
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return config, env, replaced


def _base_config() -> server_config.Config:
    """deploy/base/pools.yaml as the server loads it (the token and key files exist only in
    a pod; the loader checks only that a key file exists, so this file stands in)."""
    return load_config(
        _pools_yaml(),
        environ={"FAIRSHARE_ADMIN_TOKEN_FILE": "", "FAIRSHARE_GRANTS_KEY_FILE": __file__},
    )


def _secret_files(statefulset: Manifest, container: str = ALLOCATOR) -> dict[str, str]:
    """Files the pod's Secret volumes provide: path in the container -> ``secret/key``."""
    spec = statefulset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    files: dict[str, str] = {}
    for mount in _container(statefulset, container)["volumeMounts"]:
        # A mount without a pod volume is a volumeClaimTemplate's (etcd's data).
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            continue
        items = secret.get("items")
        if items is None:  # a kubernetes.io/tls Secret holds these keys
            items = [{"key": k, "path": k} for k in ("tls.crt", "tls.key", "ca.crt")]
        for item in items:
            path = f"{mount['mountPath']}/{item['path']}"
            files[path] = f"{secret['secretName']}/{item['key']}"
    return files


def _secret_paths(statefulset: Manifest) -> set[str]:
    """Files the pod's Secret volumes provide, by path in the container."""
    return set(_secret_files(statefulset))


@pytest.mark.parametrize("target", TARGETS, ids=[t or "default" for t in TARGETS])
def test_config_loads_with_the_server_loader_in_each_pod(target: str, tmp_path: Path) -> None:
    objects = _render(target)
    sts = _workload(objects, "StatefulSet", ALLOCATOR)
    name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
    env = _pod_env(objects, sts, ALLOCATOR)
    config_path, local_env, files = _materialise_files(tmp_path, env)
    for path in files:
        assert path in _secret_paths(sts), f"{path} is not provided by a mounted Secret"
    cfg = load_config(config_path, environ=local_env)
    assert cfg.node_id == f"{name}-0"
    peers = sts["spec"]["serviceName"]
    assert cfg.advertise == f"{name}-0.{peers}.{namespace}.svc.cluster.local:50051"
    assert cfg.etcd.endpoints, "Kubernetes runs the replicated mode: etcd endpoints are needed"
    assert cfg.pools, "the config declares no pool"
    assert cfg.admin.token_file is not None, "the admin service needs a token"
    assert cfg.grants.key_file is not None, "replicas need the shared grant keys"
    assert (target == "overlays/tls") == cfg.tls.enabled == cfg.tls.mutual


def test_environment_names_are_settings_of_the_server() -> None:
    known = set(server_config._ENV)
    files = [p for k in _kustomizations() for p in (*k.resources, *k.patches)]
    for path in files:
        for doc in _load_all(path):
            if not isinstance(doc, dict) or doc.get("kind") != "StatefulSet":
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                for item in c.get("env", []):
                    name = item["name"]
                    if name.startswith(server_config.ENV_PREFIX):
                        assert name in known, f"{path.name}: {name} is no server setting"


@pytest.mark.parametrize("target", TARGETS, ids=[t or "default" for t in TARGETS])
def test_env_references_are_defined_before_use(target: str) -> None:
    """Kubernetes leaves ``$(VAR)`` unexpanded when VAR is defined later or not at all."""
    for sts in (o for o in _render(target) if o["kind"] == "StatefulSet"):
        for c in sts["spec"]["template"]["spec"]["containers"]:
            defined: set[str] = set()
            for item in c.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", item.get("value", "")):
                    assert ref in defined, f"{sts['metadata']['name']}: {item['name']} uses {ref}"
                defined.add(item["name"])


def test_node_id_is_the_pod_name_from_the_downward_api() -> None:
    sts = _find(_objects(), "StatefulSet", ALLOCATOR)
    env = {e["name"]: e for e in _container(sts, ALLOCATOR)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["FAIRSHARE_NODE_ID"]["value"] == "$(POD_NAME)"
    assert env["FAIRSHARE_ADVERTISE"]["value"].startswith("$(POD_NAME).$(PEERS_SERVICE).")
    assert env["PEERS_SERVICE"]["value"] == sts["spec"]["serviceName"]


def test_ports_agree_with_the_config_probes_services_and_policies() -> None:
    objects = _render("")
    cfg = _base_config()
    grpc, metrics = _port(cfg.listen), _port(cfg.metrics_listen)
    sts = _find(objects, "StatefulSet", ALLOCATOR)
    c = _container(sts, ALLOCATOR)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": grpc, "metrics": metrics}
    env = _pod_env(objects, sts, ALLOCATOR)
    assert _port(env["FAIRSHARE_ADVERTISE"]) == grpc
    for probe in ("startupProbe", "readinessProbe"):
        assert c[probe]["grpc"]["port"] == grpc, f"{probe} must be the gRPC health check"
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == metrics
    assert annotations["prometheus.io/path"] == "/metrics"
    for name in ("allocator", "allocator-peers"):
        svc = _find(objects, "Service", name)
        by_name = {p["name"]: p for p in svc["spec"]["ports"]}
        assert by_name["grpc"]["port"] == grpc
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, f"Service {name}: no container port {p['targetPort']}"
    ingress = _find(objects, "NetworkPolicy", "allocator-ingress")["spec"]["ingress"]
    allowed = [p["port"] for rule in ingress for p in rule["ports"]]
    assert sorted(allowed) == sorted([grpc, grpc, metrics]), "gateways, peers, Prometheus"
    egress = _find(objects, "NetworkPolicy", "allocator-egress")["spec"]["egress"]
    assert grpc in [p["port"] for rule in egress for p in rule["ports"]], "peers' gRPC"
    assert {53} <= {p["port"] for rule in egress for p in rule["ports"]}, "DNS"


@pytest.mark.parametrize("target", TARGETS, ids=[t or "default" for t in TARGETS])
def test_liveness_is_healthz_on_the_metrics_port(target: str) -> None:
    """A hung event loop fails liveness (server/metrics.py ``/healthz``); the probe waits
    longer than the endpoint's own wait for the loop."""
    sts = _workload(_render(target), "StatefulSet", ALLOCATOR)
    c = _container(sts, ALLOCATOR)
    probe = c["livenessProbe"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert probe["httpGet"]["path"] == HEALTHZ_PATH
    assert ports[probe["httpGet"]["port"]] == _port(_base_config().metrics_listen)
    assert probe["timeoutSeconds"] > LIVENESS_TIMEOUT_S


def test_container_runs_the_image_command_the_cli_accepts(capsys: pytest.CaptureFixture) -> None:
    from fairshare.cli import main as cli

    sts = _find(_objects(), "StatefulSet", ALLOCATOR)
    c = _container(sts, ALLOCATOR)
    image = _dockerfile()
    assert "command" not in c, "the image's ENTRYPOINT runs"
    assert c["args"] == image["CMD"]
    assert image["ENTRYPOINT"] == ["fairshare"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "fairshare" in scripts
    args = c["args"]
    assert args[args.index("--config") + 1] == CONFIG_MOUNT
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == CONFIG_MOUNT)
    assert mount["subPath"] == _pools_yaml().name
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "allocator-config"  # the generator's, before kustomize
    with pytest.raises(SystemExit) as exit_:
        cli.main([args[0], "--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    for flag in (a for a in args if a.startswith("--")):
        assert flag in usage, f"`fairshare {args[0]}` has no flag {flag}"


# -- graceful handover ---------------------------------------------------------------------


def handover_budget_s(cfg: server_config.Config) -> float:
    """The longest a graceful SIGTERM handover may take (docs/deploy.md, "Grace period").

    Every owned pool's final snapshot runs concurrently: a group-commit write may be in
    flight (rpc_timeout_s), the window closes (commit_window_s) and the final fenced write
    follows (rpc_timeout_s). Then the lease revoke, which deletes the member key and
    every owner key at once so successors campaign (rpc_timeout_s). Then the gRPC server
    lets calls in flight finish for its grace period (server.app.GRACE_S).
    """
    t = cfg.timing
    snapshot = t.rpc_timeout_s + t.commit_window_s + t.rpc_timeout_s
    return snapshot + t.rpc_timeout_s + app.GRACE_S


# Interpreter exit, logging flush, a slow node: the grace period keeps this much spare.
GRACE_SAFETY_S = 5.0


def test_grace_period_covers_the_handover() -> None:
    cfg = _base_config()
    sts = _find(_objects(), "StatefulSet", ALLOCATOR)
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    need = handover_budget_s(cfg) + GRACE_SAFETY_S
    assert grace >= math.ceil(need), f"terminationGracePeriodSeconds {grace} < {need:g} s"
    # The crash path (lease expiry) is what a SIGKILL costs; a grace far above it only
    # slows rolling upgrades without making them safer.
    assert grace <= 60


# -- etcd --------------------------------------------------------------------------------


def _member_urls(objects: list[Manifest], port: int, scheme: str = "http") -> list[str]:
    """The URL of every etcd member's port by its stable name under the peer Service."""
    etcd = _workload(objects, "StatefulSet", "etcd")
    name, namespace = etcd["metadata"]["name"], etcd["metadata"]["namespace"]
    peers = etcd["spec"]["serviceName"]
    return [
        f"{scheme}://{name}-{i}.{peers}.{namespace}.svc.cluster.local:{port}"
        for i in range(etcd["spec"]["replicas"])
    ]


@pytest.mark.parametrize("target", ETCD_TARGETS, ids=[t or "default" for t in ETCD_TARGETS])
def test_etcd_endpoints_are_every_member_by_its_own_name(target: str) -> None:
    """Not one Service address: the store fails over between endpoints only when it has
    several, and gRPC keeps a connection on one member for its whole life."""
    objects = _render(target)
    scheme = "https" if target == "overlays/tls" else "http"
    sts = _workload(objects, "StatefulSet", ALLOCATOR)
    env = _pod_env(objects, sts, ALLOCATOR)
    endpoints = env["FAIRSHARE_ETCD_ENDPOINTS"].split(",")
    assert endpoints == _member_urls(objects, 2379, scheme)
    etcd = _workload(objects, "StatefulSet", "etcd")
    for i, endpoint in enumerate(endpoints):
        # Each member advertises exactly the URL the allocators dial.
        assert _pod_env(objects, etcd, "etcd", i)["ETCD_ADVERTISE_CLIENT_URLS"] == endpoint
    peer = _find(objects, "Service", etcd["spec"]["serviceName"])
    assert peer["spec"]["clusterIP"] == "None" and peer["spec"]["publishNotReadyAddresses"]
    pod_labels = etcd["spec"]["template"]["metadata"]["labels"]
    assert peer["spec"]["selector"].items() <= pod_labels.items()
    etcd_ports = {p["name"]: p["containerPort"] for p in _container(etcd, "etcd")["ports"]}
    (client,) = [p for p in peer["spec"]["ports"] if p["port"] == 2379]
    assert etcd_ports[client["targetPort"]] == 2379
    # The allocators may reach etcd's client port, and etcd accepts them.
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    egress = _workload(policies, "NetworkPolicy", "allocator-egress")["spec"]["egress"][0]
    assert egress["to"][0]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert [p["port"] for p in egress["ports"]] == [2379]
    ingress = _workload(policies, "NetworkPolicy", "etcd")["spec"]["ingress"][0]
    assert ingress["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "fairshare",
        "app.kubernetes.io/component": "allocator",
    }


def test_etcd_cluster_is_three_pinned_members_with_volumes() -> None:
    objects = _render("")
    etcd = _find(objects, "StatefulSet", "etcd")
    spec = etcd["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel", "no member is ready before a quorum"
    c = _container(etcd, "etcd")
    assert re.fullmatch(r"[\w./-]+/etcd:v3\.5\.\d+@sha256:[0-9a-f]{64}", c["image"]), c["image"]
    assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["data"]
    env = _pod_env(objects, etcd, "etcd", 1)
    peer = _find(objects, "Service", spec["serviceName"])
    assert peer["spec"]["clusterIP"] == "None" and peer["spec"]["publishNotReadyAddresses"]
    members = dict(m.split("=", 1) for m in env["ETCD_INITIAL_CLUSTER"].split(","))
    assert members == {
        f"etcd-{i}": f"http://etcd-{i}.{spec['serviceName']}.{NAMESPACE}.svc.cluster.local:2380"
        for i in range(spec["replicas"])
    }
    assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == members["etcd-1"]
    assert env["ETCD_DATA_DIR"].startswith(c["volumeMounts"][0]["mountPath"] + "/")
    pdb = _find(objects, "PodDisruptionBudget", "etcd")
    assert pdb["spec"]["maxUnavailable"] == 1


def _script_variables(script: str) -> set[str]:
    """The variables the start script requires (its ``${VAR:?}`` checks)."""
    return set(re.findall(r"\$\{(\w+):\?\}", script))


@pytest.mark.parametrize("target", ETCD_TARGETS, ids=[t or "default" for t in ETCD_TARGETS])
def test_etcd_members_start_through_the_shipped_start_script(target: str) -> None:
    """The container runs deploy/etcd/etcd-start.sh (tested against real members in
    tests/integration/test_etcd_rejoin.py) with a shell, sleep and every variable it needs."""
    objects = _render(target)
    etcd = _workload(objects, "StatefulSet", "etcd")
    pod = etcd["spec"]["template"]["spec"]
    c = _container(etcd, "etcd")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    shell, script_path = c["command"]
    script_dir, _, script_name = script_path.rpartition("/")
    config_map = volumes[mounts[script_dir]]["configMap"]["name"]
    shipped = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == config_map
    )
    script = (DEPLOY / "etcd" / "etcd-start.sh").read_text(encoding="utf-8")
    assert shipped["data"][script_name] == script
    # The init container installs busybox's applets where the shell is looked for.
    tools_dir = shell.rpartition("/")[0]
    (init,) = pod["initContainers"]
    assert [m["mountPath"] for m in init["volumeMounts"]] == [tools_dir]
    assert f"--install -s {tools_dir}" in " ".join(init["command"])
    assert volumes[mounts[tools_dir]] == volumes[init["volumeMounts"][0]["name"]]

    replicas = etcd["spec"]["replicas"]
    advertised = [
        _pod_env(objects, etcd, "etcd", i)["ETCD_ADVERTISE_CLIENT_URLS"] for i in range(replicas)
    ]
    for i in range(replicas):
        env = _pod_env(objects, etcd, "etcd", i)
        missing = _script_variables(script) - env.keys()
        assert not missing, f"member {i} lacks {missing}"
        assert tools_dir in env["PATH"].split(":") and "/usr/local/bin" in env["PATH"]
        assert "ETCD_INITIAL_CLUSTER_STATE" not in env, "the script decides it"
        # Every member's URL spelt as that member advertises it (the script skips its
        # own by comparing the two), renamed with the members; the scheme is the one
        # the members serve.
        urls = env["CLUSTER_CLIENT_URLS"].split(",")
        assert urls == advertised
        scheme = env["ETCD_LISTEN_CLIENT_URLS"].partition(":")[0]
        assert {u.partition(":")[0] for u in urls} == {scheme}
        if scheme == "https":
            files = _secret_files(etcd, "etcd")
            tls = [env[f"ETCDCTL_{n}"] for n in ("CACERT", "CERT", "KEY")]
            assert set(tls) <= files.keys(), "etcdctl's TLS files are not from a Secret"


def test_tls_overlay_reaches_etcd_over_tls_with_the_ca_etcd_serves_with(
    tmp_path: Path,
) -> None:
    objects = _render("overlays/tls")
    sts = _find(objects, "StatefulSet", ALLOCATOR)
    env = _pod_env(objects, sts, ALLOCATOR)
    config_path, local_env, _ = _materialise_files(tmp_path, env)
    cfg = load_config(config_path, environ=local_env)
    assert list(cfg.etcd.endpoints) == _member_urls(objects, 2379, "https")
    assert None not in (cfg.etcd.ca_file, cfg.etcd.cert_file, cfg.etcd.key_file)
    allocator_files = _secret_files(sts)
    ca, cert, key = (env[f"FAIRSHARE_ETCD_{name}_FILE"] for name in ("CA", "CERT", "KEY"))
    assert {ca, cert, key} <= allocator_files.keys(), "etcd client files not from a Secret"

    etcd = _find(objects, "StatefulSet", "etcd")
    etcd_env = _pod_env(objects, etcd, "etcd")
    assert etcd_env["ETCD_LISTEN_CLIENT_URLS"] == "https://0.0.0.0:2379"
    assert etcd_env["ETCD_ADVERTISE_CLIENT_URLS"] == (
        f"https://etcd-0.etcd-peer.{NAMESPACE}.svc.cluster.local:2379"
    )
    assert etcd_env["ETCD_CLIENT_CERT_AUTH"] == "true", "etcd must require client certs"
    etcd_files = _secret_files(etcd, "etcd")
    served = {etcd_env[n] for n in ("ETCD_CERT_FILE", "ETCD_KEY_FILE", "ETCD_TRUSTED_CA_FILE")}
    assert served <= etcd_files.keys(), "etcd's TLS files are not from a Secret"
    # The allocator verifies etcd with the very CA file etcd's Secret holds and trusts.
    assert allocator_files[ca] == etcd_files[etcd_env["ETCD_TRUSTED_CA_FILE"]]
    assert allocator_files[cert].endswith("/tls.crt") and allocator_files[key].endswith("/tls.key")
    client_secret = allocator_files[cert].partition("/")[0]
    server_secret = etcd_files[etcd_env["ETCD_CERT_FILE"]].partition("/")[0]
    assert client_secret != server_secret, "the allocator presents its own client certificate"


def _duration_s(text: str) -> float:
    """etcd's periodic retention: a Go duration of one unit (``5m``, ``1h``), or bare hours."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m|h)?", text)
    assert m, f"not a retention etcd's periodic mode reads as intended: {text!r}"
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 3600}[m.group(2)]


def _bytes(quantity: str) -> int:
    m = re.fullmatch(r"(\d+)(Gi|Mi)?", quantity)
    assert m, quantity
    return int(m.group(1)) * {"Gi": 2**30, "Mi": 2**20, None: 1}[m.group(2)]


def test_etcd_members_compact_their_history_within_the_quota() -> None:
    """Every member runs with periodic auto-compaction (the history stays bounded, sized in
    docs/deploy.md), a backend quota that fits its volume, and a snapshot count that keeps
    its in-memory raft log small."""
    objects = _render("")
    etcd = _find(objects, "StatefulSet", "etcd")
    env = _pod_env(objects, etcd, "etcd")
    assert env.get("ETCD_AUTO_COMPACTION_MODE") == "periodic"
    retention = _duration_s(env.get("ETCD_AUTO_COMPACTION_RETENTION", "0"))
    assert 60 <= retention <= 3600, "compacted at least hourly, yet not so often it churns"
    quota = int(env["ETCD_QUOTA_BACKEND_BYTES"])
    volume = _bytes(
        etcd["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    )
    assert 0 < quota <= volume // 2, "the db (and a defrag's copy of it) must fit the volume"
    assert 0 < int(env["ETCD_SNAPSHOT_COUNT"]) <= 100_000


# -- the allocator's pod -------------------------------------------------------------------


def test_allocator_statefulset_shape() -> None:
    objects = _objects()
    sts = _find(objects, "StatefulSet", ALLOCATOR)
    spec = sts["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel"
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    headless = _find(objects, "Service", spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True, "peers resolve while starting"
    assert _find(objects, "Service", ALLOCATOR)["spec"]["type"] == "ClusterIP"
    pdb = _find(objects, "PodDisruptionBudget", ALLOCATOR)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    spread = pod.get("topologySpreadConstraints", [])
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname" and t["whenUnsatisfiable"] == "DoNotSchedule"
        for t in spread
    ) or "podAntiAffinity" in pod.get("affinity", {})
    sa = _find(objects, "ServiceAccount", pod["serviceAccountName"])
    assert sa["automountServiceAccountToken"] is False


def test_every_selector_selects_a_pod() -> None:
    objects = _objects()
    templates = [o["spec"]["template"]["metadata"]["labels"] for o in objects
                 if o["kind"] in ("StatefulSet", "Deployment")]  # fmt: skip
    for o in objects:
        kind, spec = o["kind"], o.get("spec", {})
        if kind == "Service":
            selector = spec["selector"]
        elif kind in ("PodDisruptionBudget", "StatefulSet", "Deployment"):
            selector = spec["selector"]["matchLabels"]
        elif kind == "NetworkPolicy":
            selector = spec["podSelector"]["matchLabels"]
        else:
            continue
        assert any(selector.items() <= t.items() for t in templates), o["metadata"]["name"]


WORKLOADS = [("StatefulSet", "allocator"), ("StatefulSet", "etcd"),
             ("CronJob", "etcd-defrag"), ("CronJob", "etcd-backup"),
             ("Deployment", "gateway")]  # fmt: skip


@pytest.mark.parametrize(("kind", "name"), WORKLOADS, ids=[n for _, n in WORKLOADS])
def test_pods_are_locked_down(kind: str, name: str) -> None:
    """The namespace enforces the restricted Pod Security profile: a pod short of it is
    refused, a CronJob's at its first run."""
    workload = _find(_objects(), kind, name)
    pod = _pod_spec(workload)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for c in _pod_containers(workload):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "add" not in sc["capabilities"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= c["resources"][kind].keys(), f"{name}: {kind}"
        assert ":" in c["image"] and not c["image"].endswith(":latest")


def test_state_dir_is_a_writable_volume() -> None:
    cfg = _base_config()
    sts = _find(_objects(), "StatefulSet", ALLOCATOR)
    mounts = {m["mountPath"]: m for m in _container(sts, ALLOCATOR)["volumeMounts"]}
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    mount = mounts[str(cfg.state_dir)]
    assert not mount.get("readOnly", False)
    assert "emptyDir" in volumes[mount["name"]]


# -- every reference resolves, in every target, renamed or not ------------------------------


def _namespaced(objects: list[Manifest]) -> list[Manifest]:
    return [o for o in objects if o["kind"] not in CLUSTER_SCOPED]


def _resolve_host(objects: list[Manifest], host: str, port: int) -> str:
    """What an in-cluster DNS name (``pod.service.ns.svc.domain`` or ``service.ns.svc.
    domain``) reaches in ``objects``, failing the test when nothing would answer."""
    (domain,) = {o["data"]["domain"] for o in objects if o["kind"] == "ConfigMap"
                 and "domain" in o.get("data", {})}  # fmt: skip
    assert host.endswith(f".svc.{domain}"), f"{host} is not a name in the cluster's domain"
    labels = host.removesuffix(f".svc.{domain}").split(".")
    *pod, service, namespace = labels
    assert len(pod) <= 1, host
    svc = _find(objects, "Service", service)
    assert svc["metadata"]["namespace"] == namespace, f"{host}: Service in another namespace"
    assert port in [p["port"] for p in svc["spec"]["ports"]], f"{host}: no port {port}"
    workloads = [o for o in objects if o["kind"] == "StatefulSet"
                 and svc["spec"]["selector"].items()
                 <= o["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
    assert workloads, f"{host}: Service {service} selects no pod"
    if not pod:
        return f"Service/{service}"
    (sts,) = workloads
    assert svc["spec"].get("clusterIP") == "None", f"{host}: pod names need a headless Service"
    assert sts["spec"]["serviceName"] == service, f"{host}: not the StatefulSet's Service"
    name, _, ordinal = pod[0].rpartition("-")
    assert name == sts["metadata"]["name"], f"{host}: no StatefulSet {name}"
    assert ordinal.isdigit() and int(ordinal) < sts["spec"]["replicas"], f"{host}: no such pod"
    return f"Pod/{pod[0]}"


def _urls(value: str) -> list[str]:
    """The URLs and ``host:port`` addresses in an env value (lists, ``name=url`` pairs)."""
    return [item.partition("=")[2] if "=" in item else item for item in value.split(",")]


ADDRESS_VARS = {
    "FAIRSHARE_ADVERTISE",
    "FAIRSHARE_ETCD_ENDPOINTS",
    "ETCD_ADVERTISE_CLIENT_URLS",
    "ETCD_INITIAL_ADVERTISE_PEER_URLS",
    "ETCD_INITIAL_CLUSTER",
    "CLUSTER_CLIENT_URLS",
    "ETCDCTL_ENDPOINTS",
}


@pytest.mark.parametrize("target", TARGETS, ids=[t or "default" for t in TARGETS])
def test_every_reference_resolves_to_an_object_of_the_render(target: str) -> None:
    """Addresses built from the environment, ConfigMaps, Secrets, volumes, Services,
    ServiceAccounts and PriorityClasses name what the same render creates (Secrets: what
    docs/deploy.md has the operator create), so an overlay that renames cannot leave a
    reference behind."""
    objects = _render(target)
    (namespace,) = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]
    for o in _namespaced(objects):
        assert o["metadata"]["namespace"] == namespace, o["metadata"]["name"]
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    secrets = OPERATOR_SECRETS | (TLS_SECRETS if target == "overlays/tls" else set())
    workloads = [o for o in objects if o["kind"] in ("StatefulSet", "CronJob")]
    resolved: set[str] = set()
    for w in workloads:
        spec = _pod_spec(w)
        where = f"{w['kind']}/{w['metadata']['name']}"
        if "serviceAccountName" in spec:
            assert ("ServiceAccount", spec["serviceAccountName"]) in names, where
        if "priorityClassName" in spec:
            assert ("PriorityClass", spec["priorityClassName"]) in names, where
        if w["kind"] == "StatefulSet":
            assert ("Service", w["spec"]["serviceName"]) in names, where
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in names, f"{where}: {v}"
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, f"{where}: {v}"
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in names, f"{where}: {v}"
        replicas = w["spec"].get("replicas", 1)
        for c in _pod_containers(w):
            for ordinal in range(replicas):
                env = _pod_env(objects, w, c["name"], ordinal)
                for var in ADDRESS_VARS & env.keys():
                    for url in _urls(env[var]):
                        host, _, port = url.rpartition("//")[2].rpartition(":")
                        if target == "overlays/external-etcd" and var.startswith("FAIRSHARE_ETCD"):
                            assert host.endswith(".example.internal"), url
                            continue
                        resolved.add(_resolve_host(objects, host, int(port)))
    if target in ETCD_TARGETS:
        etcd = _workload(objects, "StatefulSet", "etcd")
        members = {f"Pod/{etcd['metadata']['name']}-{i}" for i in range(3)}
        assert members <= resolved, "every etcd member is named by some address"
        assert f"Service/{_workload(objects, 'Service', 'etcd-client')['metadata']['name']}" in (
            resolved
        ), "the backup job reaches a member through the client Service"


def test_renamed_overlay_renames_every_object_and_reference() -> None:
    objects = _render("overlays/renamed")
    default = {(o["kind"], o["metadata"]["name"]) for o in _render("")}
    for o in objects:
        name = o["metadata"]["name"]
        if o["kind"] == "Namespace":
            assert name == "fairshare-prod"
            continue
        assert name.startswith("prod-"), f"{o['kind']}/{name} kept its name"
        assert (o["kind"], name) not in default
    text = yaml.safe_dump_all(objects)
    # No address still names the default namespace or an unprefixed object.
    for stale in (".fairshare.svc", "//etcd-", "=etcd-", ".etcd-peer.", ".allocator-peers."):
        assert stale not in text, f"{stale!r} is left in the renamed render"
    kinds = {o["kind"] for o in objects}
    assert "PodMonitor" in kinds, "the renamed overlay shows the PodMonitor component too"


# -- rolling updates ---------------------------------------------------------------------


def take_back_s(cfg: server_config.Config) -> float:
    """How long after a returning replica turns Ready its pools are back on it.

    Its owners hand a pool back only after it has been a member for rebalance_settle_s;
    then the owner's final snapshot (a write in flight, the commit window, the final write),
    the delete of its owner key, the returning replica's campaign (at most campaign_delay_s
    if it missed the hint), its create and its first snapshot write.
    """
    t = cfg.timing
    handover = 2 * t.rpc_timeout_s + t.commit_window_s + t.rpc_timeout_s
    return t.rebalance_settle_s + handover + t.campaign_delay_s + 2 * t.rpc_timeout_s


def test_a_rollout_waits_for_the_returning_pod_to_take_its_pools_back() -> None:
    cfg = _base_config()
    sts = _find(_objects(), "StatefulSet", ALLOCATOR)
    spec = sts["spec"]
    need = take_back_s(cfg) + GRACE_SAFETY_S
    assert spec["minReadySeconds"] >= math.ceil(need), f"minReadySeconds < {need:g} s"
    # Each pod adds it to a rollout: no more than needed, with some rounding.
    assert spec["minReadySeconds"] <= need + 10
    # The alpha field, which the API server drops (drift in GitOps tools), is not used.
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}


# -- etcd: probes, history, maintenance ------------------------------------------------------


def test_etcd_probes_survive_nospace_and_a_defrag() -> None:
    """Liveness must not fail on the cluster-wide NOSPACE alarm nor need a quorum, and must
    ride out a defrag; tests/integration/test_etcd_probes.py asks a real member out of
    space these very paths."""
    etcd = _find(_objects(), "StatefulSet", "etcd")
    c = _container(etcd, "etcd")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        path = c[probe]["httpGet"]["path"]
        assert "exclude=NOSPACE" in path, f"{probe}: {path}"
        assert c[probe]["httpGet"]["port"] == "metrics"
    assert "serializable=true" in c["livenessProbe"]["httpGet"]["path"]
    assert "serializable" not in c["readinessProbe"]["httpGet"]["path"], "ready needs a leader"
    live = c["livenessProbe"]
    # kubeadm's timings for its etcd: 15 s per answer, 8 misses.
    assert live["timeoutSeconds"] >= 15 and live["failureThreshold"] >= 8
    assert live["periodSeconds"] * live["failureThreshold"] >= 60, "a defrag takes seconds"


def _maintenance(objects: list[Manifest], name: str) -> Manifest:
    return _workload(objects, "CronJob", name)


@pytest.mark.parametrize("target", ETCD_TARGETS, ids=[t or "default" for t in ETCD_TARGETS])
def test_defrag_and_backup_jobs_reach_etcd_as_the_allocators_do(target: str) -> None:
    objects = _render(target)
    scheme = "https" if target == "overlays/tls" else "http"
    defrag = _maintenance(objects, "etcd-defrag")
    env = _pod_env(objects, defrag, "defrag")
    assert env["ETCDCTL_ENDPOINTS"].split(",") == _member_urls(objects, 2379, scheme)
    assert _container_of(defrag, "defrag")["command"][1:2] == ["defrag"]
    backup = _maintenance(objects, "etcd-backup")
    env = _pod_env(objects, backup, "snapshot")
    assert "," not in env["ETCDCTL_ENDPOINTS"], "snapshot save takes one endpoint"
    assert env["ETCDCTL_ENDPOINTS"].startswith(f"{scheme}://")
    if scheme == "https":
        allocator = _workload(objects, "StatefulSet", ALLOCATOR)
        allocator_files = _secret_files(allocator)
        alloc_env = _pod_env(objects, allocator, ALLOCATOR)
        for job, container in ((defrag, "defrag"), (backup, "snapshot")):
            env = _pod_env(objects, job, container)
            files = _job_secret_files(job, container)
            for ours, theirs in (("CACERT", "CA"), ("CERT", "CERT"), ("KEY", "KEY")):
                mine = files[env[f"ETCDCTL_{ours}"]]
                assert mine == allocator_files[alloc_env[f"FAIRSHARE_ETCD_{theirs}_FILE"]]
    for job in (defrag, backup):
        assert job["spec"]["concurrencyPolicy"] == "Forbid"
        labels = _pod_template_labels(job)
        ingress = _workload(objects, "NetworkPolicy", "etcd")["spec"]["ingress"]
        admitted = [r for r in ingress if any(
            f.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
            and "namespaceSelector" not in f for f in r["from"])
            and 2379 in [p["port"] for p in r["ports"]]]  # fmt: skip
        assert admitted, f"{job['metadata']['name']}: etcd's NetworkPolicy refuses it"


def _container_of(workload: Manifest, name: str) -> Manifest:
    (c,) = [c for c in _pod_containers(workload) if c["name"] == name]
    return c


def _pod_template_labels(workload: Manifest) -> dict[str, str]:
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return workload["spec"]["template"]["metadata"]["labels"]


def _job_secret_files(job: Manifest, container: str) -> dict[str, str]:
    """Like _secret_files, for a CronJob's container."""
    spec = _pod_spec(job)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    files: dict[str, str] = {}
    for mount in _container_of(job, container).get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        for item in secret["items"]:
            files[f"{mount['mountPath']}/{item['path']}"] = f"{secret['secretName']}/{item['key']}"
    return files


def test_backups_kept_fit_their_volume() -> None:
    objects = _render("")
    backup = _maintenance(objects, "etcd-backup")
    kept = int(_pod_env(objects, backup, "prune")["BACKUPS_KEPT"])
    assert kept >= 2
    etcd = _find(objects, "StatefulSet", "etcd")
    quota = int(_pod_env(objects, etcd, "etcd")["ETCD_QUOTA_BACKEND_BYTES"])
    (volume,) = _pod_spec(backup)["volumes"]
    claim = _find(objects, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    size = _bytes(claim["spec"]["resources"]["requests"]["storage"])
    assert (kept + 1) * quota <= size, "the kept snapshots and the one being written"
    snapshot = _container_of(backup, "snapshot")
    assert snapshot["command"][1:3] == ["snapshot", "save"]
    assert snapshot["command"][-1].startswith(f"{volume_mount(snapshot, volume['name'])}/")
    assert _pod_spec(backup)["containers"][0]["name"] == "prune", "prunes after a snapshot"


def volume_mount(container: Manifest, volume: str) -> str:
    (path,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume]
    return str(path)


# -- scheduling: priority, QoS, spread, disruption -----------------------------------------


@pytest.mark.parametrize("name", [ALLOCATOR, "etcd"])
def test_pods_are_guaranteed_and_outrank_batch_jobs(name: str) -> None:
    objects = _objects()
    pod = _find(objects, "StatefulSet", name)["spec"]["template"]["spec"]
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        r = c["resources"]
        assert r["requests"] == r["limits"], f"{name}/{c['name']}: not Guaranteed QoS"
    pc = _find(objects, "PriorityClass", pod["priorityClassName"])
    assert 0 < pc["value"] < 1_000_000_000, "above default pods, below the system classes"
    assert pc["globalDefault"] is False


@pytest.mark.parametrize("name", [ALLOCATOR, "etcd"])
def test_spreads_honour_taints_and_etcd_members_never_share_a_node(name: str) -> None:
    pod = _find(_objects(), "StatefulSet", name)["spec"]["template"]["spec"]
    for t in pod["topologySpreadConstraints"]:
        assert t.get("nodeTaintsPolicy") == "Honor", t["topologyKey"]
    if name == "etcd":
        (term,) = pod["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        labels = _find(_objects(), "StatefulSet", name)["spec"]["template"]["metadata"]["labels"]
        assert term["labelSelector"]["matchLabels"].items() <= labels.items()


def test_disruption_budgets_let_a_drain_evict_unhealthy_pods() -> None:
    pdbs = [o for o in _objects() if o["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == 3  # allocator, etcd, gateway
    for pdb in pdbs:
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


IMAGE = re.compile(r"[a-z0-9.-]+\.[a-z]{2,}(:\d+)?/[a-z0-9._/-]+:[\w.-]+@sha256:[0-9a-f]{64}")


@pytest.mark.parametrize("target", TARGETS, ids=[t or "default" for t in TARGETS])
def test_images_name_a_registry_and_a_digest(target: str) -> None:
    for w in (o for o in _render(target) if o["kind"] in ("StatefulSet", "CronJob")):
        for c in _pod_containers(w):
            assert IMAGE.fullmatch(c["image"]), f"{w['metadata']['name']}/{c['name']}: {c['image']}"


# -- network policies -------------------------------------------------------------------


NODELOCAL_DNS = "169.254.20.10/32"


def test_etcd_members_reach_each_other_on_both_ports_and_dns_everywhere() -> None:
    objects = _objects()
    etcd = _find(objects, "NetworkPolicy", "etcd")
    labels = _find(objects, "StatefulSet", "etcd")["spec"]["template"]["metadata"]["labels"]
    to_members = [r for r in etcd["spec"]["egress"]
                  if any(t.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
                         and "podSelector" in t for t in r["to"])]  # fmt: skip
    assert {p["port"] for r in to_members for p in r["ports"]} == {2379, 2380}
    members = etcd["spec"]["podSelector"]["matchLabels"]
    from_members = [r for r in etcd["spec"]["ingress"]
                    if any(f.get("podSelector", {}).get("matchLabels") == members
                           for f in r["from"])]  # fmt: skip
    assert {p["port"] for r in from_members for p in r["ports"]} == {2379, 2380}
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        if "Egress" not in policy["spec"]["policyTypes"]:
            continue
        dns = [r for r in policy["spec"]["egress"] if 53 in [p["port"] for p in r["ports"]]]
        assert len(dns) == 1, policy["metadata"]["name"]
        peers = dns[0]["to"]
        assert any(t.get("podSelector", {}).get("matchLabels") == {"k8s-app": "kube-dns"}
                   for t in peers), "kube-dns"  # fmt: skip
        assert {"ipBlock": {"cidr": NODELOCAL_DNS}} in peers, "NodeLocal DNSCache"
        assert sorted((p["port"], p["protocol"]) for p in dns[0]["ports"]) == [
            (53, "TCP"),
            (53, "UDP"),
        ]


# -- the Prometheus Operator --------------------------------------------------------------


def test_podmonitors_scrape_the_metrics_ports() -> None:
    """The validator has no schema for PodMonitor: the fields that matter, checked here."""
    objects = _render("overlays/renamed")
    monitors = [o for o in objects if o["kind"] == "PodMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"prod-allocator", "prod-etcd"}
    workloads = [o for o in objects if o["kind"] == "StatefulSet"]
    for m in monitors:
        assert m["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(m["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector"}
        selector = m["spec"]["selector"]["matchLabels"]
        (sts,) = [w for w in workloads if selector.items() <= _pod_template_labels(w).items()]
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        ports = {
            p["name"]: p["containerPort"] for c in _pod_containers(sts) for p in c.get("ports", [])
        }
        for endpoint in m["spec"]["podMetricsEndpoints"]:
            assert set(endpoint) <= {"port", "path", "interval"}
            assert ports[endpoint["port"]] == int(annotations["prometheus.io/port"])
            assert endpoint["path"] == annotations["prometheus.io/path"]


# -- the image ---------------------------------------------------------------------------


def _dockerfile() -> dict[str, Any]:
    """The Dockerfile's instructions that matter here (continuation lines joined)."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    lines = re.sub(r"\\\n", " ", text).splitlines()
    result: dict[str, Any] = {"FROM": [], "COPY": [], "ARG": {}, "EXPOSE": [], "USER": None}
    for line in (ln.strip() for ln in lines):
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            result["FROM"].append(rest.split()[0])
        elif op == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            result["ARG"][key] = value
        elif op == "COPY":
            result["COPY"].append(shlex.split(rest))
        elif op == "EXPOSE":
            result["EXPOSE"] += [int(p.split("/")[0]) for p in rest.split()]
        elif op in ("ENTRYPOINT", "CMD"):
            result[op] = yaml.safe_load(rest)
        elif op == "USER":
            result["USER"] = rest
    return result


def test_dockerfile_is_multi_stage_pinned_and_non_root() -> None:
    image = _dockerfile()
    assert len(image["FROM"]) >= 2, "multi-stage"
    bases = {image["ARG"].get(f.strip("${}"), f) for f in image["FROM"]}
    assert len(bases) == 1, "build and runtime stages share one base"
    (base,) = bases
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    uid, _, gid = image["USER"].partition(":")
    assert uid.isdigit() and int(uid) > 0, "a numeric non-root user (runAsNonRoot checks it)"
    sts = _find(_objects(), "StatefulSet", ALLOCATOR)
    ctx = sts["spec"]["template"]["spec"]["securityContext"]
    assert (int(uid), int(gid or uid)) == (ctx["runAsUser"], ctx["runAsGroup"])
    cfg = _base_config()
    assert sorted(image["EXPOSE"]) == sorted([_port(cfg.listen), _port(cfg.metrics_listen)])


def _docker_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex (Go's filepath.Match, plus ``**``)."""
    out = []
    for token in re.findall(r"\*\*/?|\*|\?|\[[^\]]*\]|[^*?\[]", pattern):
        if token.startswith("**"):
            out.append("(?:.*/)?" if token.endswith("/") else ".*")
        elif token == "*":
            out.append("[^/]*")
        elif token == "?":
            out.append("[^/]")
        elif token.startswith("["):
            out.append(token.replace("[!", "[^", 1))
        else:
            out.append(re.escape(token))
    return re.compile("".join(out))


def _docker_excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = not negated
    return excluded


def _dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((negated, _docker_pattern(line.lstrip("!").strip("/"))))
    return rules


def test_build_context_holds_the_packages_and_nothing_else() -> None:
    rules = _dockerignore()
    image = _dockerfile()
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = sorted({p.split(".")[0] for p in packages["packages"]["find"]["include"]})
    copied = {src for args in image["COPY"] if not args[0].startswith("--")
              for src in args[:-1]}  # fmt: skip
    for root in roots:
        assert root in copied, f"the Dockerfile does not copy {root}/"
        for path in (REPO / root).rglob("*"):
            rel = path.relative_to(REPO).as_posix()
            if path.is_file() and "__pycache__" not in rel:
                assert not _docker_excluded(rel, rules), f"{rel} is left out of the image"
    assert (REPO / "fairshare" / "wire" / "pb" / "__init__.py").is_file(), "stubs are committed"
    assert not _docker_excluded("fairshare/wire/pb/__init__.py", rules)
    assert not _docker_excluded("pyproject.toml", rules)
    for rel in (
        ".git/HEAD",
        ".venv/bin/python",
        "tests/unit/test_deploy.py",
        "deploy/kustomization.yaml",
        "docs/deploy.md",
        "server/__pycache__/cli.cpython-311.pyc",
        "fairshare.egg-info/PKG-INFO",
        "state/pools.json",
    ):
        assert _docker_excluded(rel, rules), f"{rel} would be sent to the build"


# -- docs ---------------------------------------------------------------------------------


def _exported_metric_names() -> set[str]:
    """The metric families one replica exports, with every state gauge populated."""
    from prometheus_client import generate_latest

    from fairshare import TeamStat
    from ha.api import Epoch, NodeId, PoolName, PoolStatus
    from server.metrics import Metrics, Outcome

    team = TeamStat("t", 1.0, 1, 1, 0, 10, 1.0, 1.0, 0, 0)
    status = PoolStatus(
        pool=PoolName("p"),
        owned=True,
        owner=NodeId("allocator-0"),
        epoch=Epoch(7),
        transitions=1,
        fence_left_s=3.0,
        snapshot_age_s=0.5,
        teams=[team],
        degraded_decisions=0,
        within={"t": 1},
    )
    metrics = Metrics(lambda: [status])
    metrics.count("p", "t", Outcome.WITHIN, 0.001)
    metrics.observe_forward("Acquire", 0.001)
    text = generate_latest(metrics.registry).decode()
    names = set(re.findall(r"^# TYPE (\w+) ", text, flags=re.MULTILINE))
    samples = set(re.findall(r"^(fairshare_\w+)[{ ]", text, flags=re.MULTILINE))
    return names | samples


def test_docs_name_only_metrics_the_server_exports() -> None:
    exported = _exported_metric_names()
    text = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\b(fairshare_[a-z_]+)\b", text))
    assert named, "docs/deploy.md names no metric"
    assert named - exported == set(), f"not exported by server/metrics.py: {named - exported}"
    # And every exported family is documented.
    families = {n for n in exported if not n.endswith(("_bucket", "_count", "_sum", "_created"))}
    families -= {n.removesuffix("_total") for n in families if n.endswith("_total")}
    assert families - named == set(), f"undocumented metrics: {families - named}"


def test_grant_keys_come_from_a_secret_mounted_as_a_directory() -> None:
    # A subPath mount would never see the Secret change: rotation needs the directory.
    sts = _find(_objects(), "StatefulSet", ALLOCATOR)
    container = _container(sts, ALLOCATOR)
    env = {item["name"]: item.get("value") for item in container["env"]}
    key_file = env["FAIRSHARE_GRANTS_KEY_FILE"]
    assert key_file in _secret_paths(sts)
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in container["volumeMounts"] if key_file.startswith(m["mountPath"] + "/"))
    assert "subPath" not in mount and mount.get("readOnly")
    assert volumes[mount["name"]]["secret"]["secretName"] == "fairshare-grant-keys"
