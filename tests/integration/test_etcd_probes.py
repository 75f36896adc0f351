"""The etcd probes of deploy/etcd ask a real member out of space what kubelet would.

etcd's NOSPACE alarm is cluster-wide, and ``/health`` fails on any alarm: a liveness probe
on it would restart every member at once, each still able to serve reads and to let an
operator compact and defragment. The probes exclude NOSPACE; this checks that etcd 3.4
(the tests' etcd; the image runs 3.5, which reads the same parameters) answers them
healthy while the alarm is raised, and that the alarm really is raised.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.etcd import find_etcd, find_etcdctl
from harness.net import free_port

pytestmark = pytest.mark.timeout(60)

STATEFULSET = Path(__file__).resolve().parents[2] / "deploy" / "etcd" / "statefulset.yaml"
QUOTA_BYTES = 1024 * 1024


def _probe_paths() -> dict[str, str]:
    doc = yaml.safe_load(STATEFULSET.read_text(encoding="utf-8"))
    (c,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "etcd"]
    return {p: c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def full_etcd(tmp_path: Path) -> Iterator[str]:
    """A one-member etcd with a 1 MiB quota, filled until its NOSPACE alarm is raised;
    yields the URL of its metrics listener (where the probes go, as in the StatefulSet)."""
    client, peer, metrics = free_port(), free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    metrics_url = f"http://127.0.0.1:{metrics}"
    # fmt: off
    args = [
        find_etcd(), "--name", "full", "--data-dir", str(tmp_path / "full.etcd"),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"full={peer_url}", "--listen-metrics-urls", metrics_url,
        "--quota-backend-bytes", str(QUOTA_BYTES), "--logger", "zap", "--log-level", "error",
    ]
    # fmt: on
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"etcd exited with {proc.returncode}"
            try:
                if _get(f"{metrics_url}/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.05)
        etcdctl = [find_etcdctl(), "--endpoints", client_url]
        ctl_env = {**env, "ETCDCTL_API": "3"}
        blob = "x" * 100_000
        for i in range(100):
            put = subprocess.run(
                [*etcdctl, "put", f"/probe-test/{i % 4}", blob],
                capture_output=True,
                text=True,
                env=ctl_env,
                timeout=10,
                check=False,
            )
            if put.returncode != 0:
                assert "space" in put.stderr, put.stderr
                break
        else:
            raise AssertionError(f"etcd took 100 puts of 100 KB with a {QUOTA_BYTES} quota")
        alarms = subprocess.run(
            [*etcdctl, "alarm", "list"],
            capture_output=True,
            text=True,
            env=ctl_env,
            timeout=10,
            check=True,
        )
        assert "NOSPACE" in alarms.stdout, alarms.stdout
        yield metrics_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_probes_stay_healthy_on_a_member_out_of_space(full_etcd: str) -> None:
    # The alarm fails the plain health check, as the old liveness probe saw it.
    assert _get(f"{full_etcd}/health")[0] == 503
    assert _get(f"{full_etcd}/health?serializable=true")[0] == 503
    for probe, path in _probe_paths().items():
        status, body = _get(f"{full_etcd}{path}")
        assert status == 200, f"{probe} {path}: {status} {body}"
        assert json.loads(body)["health"] == "true", f"{probe} {path}: {body}"
