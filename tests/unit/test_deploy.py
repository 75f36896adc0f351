"""The Kubernetes deployment (deploy/) and the image (Dockerfile) agree with the server.

Everything here is offline: manifests are checked against the JSON schemas bundled with
``kubernetes-validate`` (with sockets blocked, so a schema that would be fetched fails the
test), the pools config is loaded with the server's own loader, and kustomize renders
through ``kubectl kustomize`` (client side only, no cluster).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

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
TARGETS = ["", "overlays/external-etcd", "overlays/tls"]

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
    entries = [directory / r for r in doc.get("resources", [])]
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


def _container(statefulset: Manifest, name: str) -> Manifest:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def _expand_env(env: list[Manifest], fields: Mapping[str, str]) -> dict[str, str]:
    """The environment Kubernetes gives the container (``$(VAR)`` expanded in order)."""
    result: dict[str, str] = {}
    for item in env:
        if "valueFrom" in item:
            result[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
            continue
        result[item["name"]] = re.sub(
            r"\$\((\w+)\)", lambda m: result.get(m.group(1), m.group(0)), item["value"]
        )
    return result


POD_FIELDS = {"metadata.name": f"{ALLOCATOR}-0", "metadata.namespace": NAMESPACE}


def _pools_yaml() -> Path:
    base = _kustomization(DEPLOY / "base")
    (generator,) = base.doc["configMapGenerator"]
    assert generator["name"] == "allocator-config"
    (path,) = base.generated
    return path


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


# -- rendering with kustomize ---------------------------------------------------------------


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed on this machine")
    return path


def _render(target: str) -> list[Manifest]:
    out = subprocess.run(
        [_kubectl(), "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize deploy/{target} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


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


def test_every_object_is_in_the_namespace_the_deployment_creates() -> None:
    objects = _objects()
    assert _find(objects, "Namespace", NAMESPACE)
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == NAMESPACE, o["metadata"]["name"]
    gen = _kustomization(DEPLOY / "base").doc["configMapGenerator"][0]
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
    objects = _render(target) if target else _objects()
    sts = _find(objects, "StatefulSet", ALLOCATOR)
    env = _expand_env(_container(sts, ALLOCATOR)["env"], POD_FIELDS)
    config_path, local_env, files = _materialise_files(tmp_path, env)
    for path in files:
        assert path in _secret_paths(sts), f"{path} is not provided by a mounted Secret"
    cfg = load_config(config_path, environ=local_env)
    assert cfg.node_id == f"{ALLOCATOR}-0"
    assert cfg.advertise == f"{ALLOCATOR}-0.allocator-peers.{NAMESPACE}.svc.cluster.local:50051"
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
    headless = sts["spec"]["serviceName"]
    assert env["FAIRSHARE_ADVERTISE"]["value"].startswith(f"$(POD_NAME).{headless}.")


def test_ports_agree_with_the_config_probes_services_and_policies() -> None:
    objects = _objects()
    cfg = _base_config()
    grpc, metrics = _port(cfg.listen), _port(cfg.metrics_listen)
    sts = _find(objects, "StatefulSet", ALLOCATOR)
    c = _container(sts, ALLOCATOR)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": grpc, "metrics": metrics}
    env = _expand_env(c["env"], POD_FIELDS)
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
    sts = _find(_render(target), "StatefulSet", ALLOCATOR)
    c = _container(sts, ALLOCATOR)
    probe = c["livenessProbe"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert probe["httpGet"]["path"] == HEALTHZ_PATH
    assert ports[probe["httpGet"]["port"]] == _port(_base_config().metrics_listen)
    assert probe["timeoutSeconds"] > LIVENESS_TIMEOUT_S


def test_container_runs_the_image_command_the_cli_accepts(capsys: pytest.CaptureFixture) -> None:
    from cli import main as cli

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
    assert volume["configMap"]["name"] == "allocator-config"
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


def test_etcd_endpoints_point_at_the_etcd_client_service() -> None:
    objects = _objects()
    cfg = _base_config()
    etcd = _find(objects, "StatefulSet", "etcd")
    etcd_ports = {p["name"]: p["containerPort"] for p in _container(etcd, "etcd")["ports"]}
    pod_labels = etcd["spec"]["template"]["metadata"]["labels"]
    for endpoint in cfg.etcd.endpoints:
        m = re.fullmatch(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", endpoint)
        assert m, f"{endpoint} is not a Service's cluster DNS name"
        name, namespace, port = m.group(1), m.group(2), int(m.group(3))
        svc = _find(objects, "Service", name)
        assert namespace == svc["metadata"]["namespace"]
        assert svc["spec"]["selector"].items() <= pod_labels.items(), f"{name} selects no etcd"
        (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == port]
        assert etcd_ports[svc_port["targetPort"]] == 2379 == port
    # The allocators may reach etcd's client port, and etcd accepts them.
    egress = _find(objects, "NetworkPolicy", "allocator-egress")["spec"]["egress"][0]
    assert egress["to"][0]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert [p["port"] for p in egress["ports"]] == [2379]
    ingress = _find(objects, "NetworkPolicy", "etcd")["spec"]["ingress"][0]
    assert ingress["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "fairshare",
        "app.kubernetes.io/component": "allocator",
    }


def test_etcd_cluster_is_three_pinned_members_with_volumes() -> None:
    objects = _objects()
    etcd = _find(objects, "StatefulSet", "etcd")
    spec = etcd["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel", "no member is ready before a quorum"
    c = _container(etcd, "etcd")
    assert re.fullmatch(r"[\w./-]+/etcd:v3\.5\.\d+", c["image"]), c["image"]
    assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["data"]
    env = _expand_env(c["env"], {"metadata.name": "etcd-1", "metadata.namespace": NAMESPACE})
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


ETCD_TARGETS = ["", "overlays/tls"]


def _script_variables(script: str) -> set[str]:
    """The variables the start script requires (its ``${VAR:?}`` checks)."""
    return set(re.findall(r"\$\{(\w+):\?\}", script))


@pytest.mark.parametrize("target", ETCD_TARGETS, ids=[t or "default" for t in ETCD_TARGETS])
def test_etcd_members_start_through_the_shipped_start_script(target: str) -> None:
    """The container runs deploy/etcd/etcd-start.sh (tested against real members in
    tests/integration/test_etcd_rejoin.py) with a shell, sleep and every variable it needs."""
    objects = _render(target)
    etcd = _find(objects, "StatefulSet", "etcd")
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

    for i in range(etcd["spec"]["replicas"]):
        env = _expand_env(c["env"], {"metadata.name": f"etcd-{i}", "metadata.namespace": NAMESPACE})
        missing = _script_variables(script) - env.keys()
        assert not missing, f"etcd-{i} lacks {missing}"
        assert tools_dir in env["PATH"].split(":") and "/usr/local/bin" in env["PATH"]
        assert "ETCD_INITIAL_CLUSTER_STATE" not in env, "the script decides it"
        urls = env["CLUSTER_CLIENT_URLS"].split(",")
        assert len(urls) == etcd["spec"]["replicas"]
        # Its own advertised URL is one of them, spelt the same (the script skips it);
        # the scheme is the one the members serve.
        assert env["ETCD_ADVERTISE_CLIENT_URLS"] in urls
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
    env = _expand_env(_container(sts, ALLOCATOR)["env"], POD_FIELDS)
    config_path, local_env, _ = _materialise_files(tmp_path, env)
    cfg = load_config(config_path, environ=local_env)
    assert cfg.etcd.endpoints == ("https://etcd-client.fairshare.svc.cluster.local:2379",)
    assert None not in (cfg.etcd.ca_file, cfg.etcd.cert_file, cfg.etcd.key_file)
    allocator_files = _secret_files(sts)
    ca, cert, key = (env[f"FAIRSHARE_ETCD_{name}_FILE"] for name in ("CA", "CERT", "KEY"))
    assert {ca, cert, key} <= allocator_files.keys(), "etcd client files not from a Secret"

    etcd = _find(objects, "StatefulSet", "etcd")
    etcd_env = _expand_env(
        _container(etcd, "etcd")["env"],
        {"metadata.name": "etcd-0", "metadata.namespace": NAMESPACE},
    )
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
    etcd = _find(_objects(), "StatefulSet", "etcd")
    c = _container(etcd, "etcd")
    env = _expand_env(c["env"], {"metadata.name": "etcd-0", "metadata.namespace": NAMESPACE})
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
                 if o["kind"] == "StatefulSet"]  # fmt: skip
    for o in objects:
        kind, spec = o["kind"], o.get("spec", {})
        if kind == "Service":
            selector = spec["selector"]
        elif kind in ("PodDisruptionBudget", "StatefulSet"):
            selector = spec["selector"]["matchLabels"]
        elif kind == "NetworkPolicy":
            selector = spec["podSelector"]["matchLabels"]
        else:
            continue
        assert any(selector.items() <= t.items() for t in templates), o["metadata"]["name"]


@pytest.mark.parametrize("name", ["allocator", "etcd"])
def test_pods_are_locked_down(name: str) -> None:
    sts = _find(_objects(), "StatefulSet", name)
    pod = sts["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for c in pod["containers"]:
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
    roots = sorted({p.rstrip("*") for p in packages["packages"]["find"]["include"]})
    copied = {src for args in image["COPY"] if not args[0].startswith("--")
              for src in args[:-1]}  # fmt: skip
    for root in roots:
        assert root in copied, f"the Dockerfile does not copy {root}/"
        for path in (REPO / root).rglob("*"):
            rel = path.relative_to(REPO).as_posix()
            if path.is_file() and "__pycache__" not in rel:
                assert not _docker_excluded(rel, rules), f"{rel} is left out of the image"
    assert (REPO / "wire" / "pb" / "__init__.py").is_file(), "stubs are committed"
    assert not _docker_excluded("wire/pb/__init__.py", rules)
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
