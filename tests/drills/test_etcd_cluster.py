"""The three-member etcd helper does what the drills rely on (harness/etcd_cluster.py)."""

from __future__ import annotations

import subprocess
import time

import pytest

from harness.etcd import find_etcdctl
from harness.etcd_cluster import EtcdCluster

pytestmark = [pytest.mark.drill, pytest.mark.etcd, pytest.mark.timeout(60)]


def _put(cluster: EtcdCluster, member: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            find_etcdctl(),
            f"--endpoints={cluster.member(member).endpoint}",
            "--command-timeout=1s",
            "put",
            "/etcd-cluster-test/k",
            "v",
        ],
        capture_output=True,
        text=True,
        timeout=5,
        env={"ETCDCTL_API": "3"},
        check=False,
    )


def _put_within(cluster: EtcdCluster, member: str, seconds: float = 10.0) -> str:
    """Puts through ``member`` until one succeeds (bounded); returns the last failure's
    output, or "" on success. A member whose peer links were just restored needs a moment
    (etcd's peer streams reconnect with backoff) before it can forward a write."""
    deadline = time.monotonic() + seconds
    while True:
        done = _put(cluster, member)
        if done.returncode == 0:
            return ""
        if time.monotonic() > deadline:
            return done.stderr
        time.sleep(0.2)


def test_an_isolated_member_serves_clients_without_a_leader_and_rejoins_when_healed() -> None:
    cluster = EtcdCluster(name="helper")
    try:
        cluster.start()
        names = [m.name for m in cluster.members]
        cluster.move_leader(names[1])
        assert cluster.leader() == names[1]

        cluster.isolate(names[0])
        # The majority keeps its leader; the cut member loses it but still answers.
        for _ in range(50):
            if int(str(cluster.status(names[0]).get("leader", 0))) == 0:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert int(str(cluster.status(names[0]).get("leader", 0))) == 0
        assert _put(cluster, names[0]).returncode != 0
        assert _put_within(cluster, names[2]) == ""

        cluster.heal()
        assert cluster.leader() == names[1]  # pre-vote: the returning member deposes no one
        assert _put_within(cluster, names[0]) == ""

        cluster.kill(names[1])
        assert cluster.leader() in (names[0], names[2])
        cluster.restart_member(names[1])
        assert cluster.leader() in names
    finally:
        cluster.close()
    assert not any(m.running for m in cluster.members)
    assert not cluster.dir.exists()
