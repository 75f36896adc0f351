"""Fixtures shared by every test tier.

``etcd_server`` is one real etcd member for the whole session (tests that only read and
write use it, each under its own key prefix); ``etcd_disposable`` is a private member
for a test that stops, pauses or restarts it. Both come from ``harness/etcd.py``,
which the failover drills reuse. A machine without the etcd binary fails these tests
with the command that installs it: a suite that skipped them would pass untested.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from harness.etcd import EtcdNotInstalled, EtcdProcess


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before each test, collects what the earlier ones left and freezes what survives (the
    session's modules, fixtures and reports) out of the garbage collector's sight.

    Unfrozen, a full collection walks all of it: in the whole suite under its usual load it
    stopped the test process for up to about 200 ms, as long as the deadline some tests
    give a live replica (0.2 s), which then answered "late" one run in many. Frozen, a
    collection walks only what the running test made.
    """
    gc.collect()
    gc.freeze()


@pytest.hookimpl
def pytest_fixture_post_finalizer(fixturedef: pytest.FixtureDef[object]) -> None:
    """A module's or the session's fixture torn down: what it held, frozen with it, may be
    garbage now. Unfrozen, the next test's collection walks (and frees) it once."""
    if fixturedef.scope != "function":
        gc.unfreeze()


def _etcd(name: str) -> EtcdProcess:
    try:
        return EtcdProcess(name=name)
    except EtcdNotInstalled as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdProcess]:
    """One etcd member on 127.0.0.1 for the session; stopped (and its data deleted) at the
    end. Use ``.endpoints``; leave it running (see ``etcd_disposable`` for disruption)."""
    etcd = _etcd("fairshare-session")
    try:
        etcd.start()
        yield etcd
    finally:
        etcd.close()


@pytest.fixture
def etcd_endpoints(etcd_server: EtcdProcess) -> list[str]:
    """The client endpoints of the session's etcd, running."""
    if not etcd_server.running:
        etcd_server.start()  # a previous test stopped it: give the next one a live member
    return etcd_server.endpoints


@pytest.fixture
def etcd_disposable() -> Iterator[EtcdProcess]:
    """A private etcd member that the test may stop, kill, pause, resume and restart."""
    etcd = _etcd("fairshare-disposable")
    try:
        etcd.start()
        yield etcd
    finally:
        etcd.close()
