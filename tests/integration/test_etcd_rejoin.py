"""The etcd members' start script (deploy/etcd/etcd-start.sh) against three real etcd
members on loopback: it forms a new cluster on a first start, a member that lost its
data dir rejoins the running cluster under a new id instead of crash-looping, and waits
rather than starting a cluster of its own while the member still running has no quorum.

Every member is started by the very script the StatefulSet ships, with the settings a pod
gives it (``ETCD_*`` variables, ``CLUSTER_CLIENT_URLS``) and a ``PATH`` holding only etcd,
etcdctl and sleep, as in the pod.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.etcd import EtcdProcess
from harness.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "etcd" / "etcd-start.sh"


@pytest.fixture
def cluster() -> Iterator[EtcdCluster]:
    c = EtcdCluster(name="rejoin", launcher=SCRIPT)
    try:
        c.start()
        yield c
    finally:
        c.close()


def _started(cluster: EtcdCluster, member: str | int = 0) -> dict[str, str]:
    """name -> id (hex) of every started member, as ``member`` sees the cluster."""
    return {
        str(m["name"]): f"{int(str(m['ID'])):x}"
        for m in cluster.member_list(member)
        if m.get("name") and m.get("clientURLs")
    }


def test_members_started_together_form_a_new_cluster(cluster: EtcdCluster) -> None:
    names = {m.name for m in cluster.members}
    assert set(_started(cluster)) == names
    for m in cluster.members:
        assert "initial cluster state new" in m.log_tail(200), m.log_tail()


def test_a_member_that_lost_its_data_rejoins(cluster: EtcdCluster) -> None:
    lost = cluster.members[2]
    cluster.members[0].etcdctl("put", "/rejoin/before", "kept")
    old_id = _started(cluster)[lost.name]

    cluster.stop(lost.name)
    shutil.rmtree(lost.data_dir)
    cluster.members[0].etcdctl("put", "/rejoin/during", "also kept")
    cluster.restart_member(lost.name)

    log = lost.log_tail(200)
    assert "rejoining the cluster" in log, log
    assert f"removing the member entry {old_id}" in log, log
    assert "initial cluster state existing" in log, log
    # Three started members, the same names, the rejoined one under a new id; every
    # member sees the same membership and answers a health check.
    for m in cluster.members:
        seen = _started(cluster, m.name)
        assert set(seen) == {x.name for x in cluster.members}, (m.name, seen)
        assert seen[lost.name] != old_id, seen
        m.etcdctl("endpoint", "health")
    assert len(cluster.member_list()) == 3
    cluster.leader(timeout_s=10)
    # It has the data written before and while it was gone, in its own store.
    for key, value in (("/rejoin/before", "kept"), ("/rejoin/during", "also kept")):
        out = lost.etcdctl("get", key, "--consistency=s", "--print-value-only")
        assert out.strip() == value, out

    # Restarted again on its new data, it starts as it is (no second rejoin).
    cluster.stop(lost.name)
    cluster.restart_member(lost.name)
    assert _started(cluster)[lost.name] == _started(cluster, lost.name)[lost.name]
    cluster.members[0].etcdctl("del", "--prefix", "/rejoin/")


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.1)


def _answers(member: EtcdProcess) -> bool:
    try:
        member.etcdctl("endpoint", "status", timeout_s=2)
    except RuntimeError:
        return False
    return True


def test_a_wiped_member_waits_for_the_quorum_instead_of_starting_a_new_cluster(
    cluster: EtcdCluster,
) -> None:
    """One member down and another's data lost: the last one still answers but has no
    quorum. The script must not start a new cluster (its own log, which the cluster would
    never accept); it exits, and rejoins once the cluster is healthy again."""
    first, second, lost = cluster.members
    first.etcdctl("put", "/rejoin/kept", "yes")
    cluster.stop(second.name)
    cluster.stop(lost.name)
    shutil.rmtree(lost.data_dir)
    # Alone, the first member has no quorum, but it has served: it answers a status.
    assert _answers(first)
    lost.spawn()
    _wait(lambda: not lost.running, "the wiped member's script exits")
    lost.kill()  # reaps it
    log = lost.log_tail(50)
    assert "not starting a new one" in log, log
    assert not (lost.data_dir / "member" / "wal").exists(), "it made a log of its own"

    cluster.restart_member(second.name)
    cluster.restart_member(lost.name)
    assert "rejoining the cluster" in lost.log_tail(50)
    assert set(_started(cluster, lost.name)) == {m.name for m in cluster.members}
    out = lost.etcdctl("get", "/rejoin/kept", "--consistency=s", "--print-value-only")
    assert out.strip() == "yes", out
    first.etcdctl("del", "--prefix", "/rejoin/")
