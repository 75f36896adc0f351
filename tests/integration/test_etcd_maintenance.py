"""The etcd maintenance CronJobs of deploy/etcd run their very commands against a real etcd.

The manifests' ``command`` lines (etcdctl defrag; etcdctl snapshot save; the shell line
that prunes old snapshots) are taken from ``deploy/etcd/maintenance.yaml``, expanded the
way Kubernetes expands ``$(VAR)`` and ``$$``, and run here against a three-member etcd on
loopback, with the local etcdctl for the image's and a temporary directory for the
backup volume.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.etcd import find_etcdctl
from harness.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.timeout(60)

MAINTENANCE = Path(__file__).resolve().parents[2] / "deploy" / "etcd" / "maintenance.yaml"
IMAGE_ETCDCTL = "/usr/local/bin/etcdctl"


def _containers() -> dict[str, dict[str, Any]]:
    """Every container of the two CronJobs, by name."""
    found: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(MAINTENANCE.read_text(encoding="utf-8")):
        if doc and doc["kind"] == "CronJob":
            pod = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                found[c["name"]] = c
    return found


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of a command: ``$(VAR)`` if defined, ``$$`` to ``$``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\((\w+)\)", one, text)


def _run(
    command: list[str], env: Mapping[str, str], backup: Path
) -> subprocess.CompletedProcess[str]:
    args = [_expand(a, env).replace("/backup", str(backup)) for a in command]
    if args[0] == IMAGE_ETCDCTL:
        args[0] = find_etcdctl()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    return subprocess.run(
        args, capture_output=True, text=True, env={**clean, **env}, timeout=30, check=False
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    c = EtcdCluster(name="maintenance")
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_defrag_runs_on_every_member_one_after_another(cluster: EtcdCluster) -> None:
    defrag = _containers()["defrag"]
    endpoints = ",".join(f"http://{e}" for e in cluster.endpoints)
    out = _run(defrag["command"], {"ETCDCTL_ENDPOINTS": endpoints}, Path("/nonexistent"))
    assert out.returncode == 0, out.stderr
    for endpoint in cluster.endpoints:
        assert f"Finished defragmenting etcd member[http://{endpoint}]" in out.stdout, out.stdout


def test_backup_saves_a_snapshot_and_keeps_the_newest(cluster: EtcdCluster, tmp_path: Path) -> None:
    containers = _containers()
    snapshot, prune = containers["snapshot"], containers["prune"]
    kept = int(next(e["value"] for e in prune["env"] if e["name"] == "BACKUPS_KEPT"))
    # Older runs' snapshots (oldest first) and a part file a failed run left behind.
    now = time.time()
    old = [tmp_path / f"etcd-backup-{28000000 + i}-old{i}.db" for i in range(kept + 2)]
    for age, path in enumerate(reversed(old), start=1):
        path.write_bytes(b"old")
        os.utime(path, (now - 3600 * age, now - 3600 * age))
    (tmp_path / "etcd-backup-27999999-fail.db.part").write_bytes(b"partial")

    env = {
        "POD_NAME": "etcd-backup-29000000-abcde",
        "ETCDCTL_ENDPOINTS": f"http://{cluster.endpoints[0]}",
    }
    out = _run(snapshot["command"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    saved = tmp_path / "etcd-backup-29000000-abcde.db"
    status = subprocess.run(
        [find_etcdctl(), "snapshot", "status", str(saved), "-w", "json"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert '"totalKey"' in status.stdout, status.stdout

    out = _run(prune["command"], {"BACKUPS_KEPT": str(kept)}, tmp_path)
    assert out.returncode == 0, out.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    newest_old = sorted(p.name for p in old[-(kept - 1) :])
    assert left == sorted([saved.name, *newest_old]), left
