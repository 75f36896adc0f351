"""The client library a gateway installs loads nothing of the server or the replication layer.

A fresh interpreter imports ``fairshare.client`` under ``-X importtime``, which lists every module
it loads; none may belong to ``server``, ``ha``, ``prometheus_client`` or ``yaml``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = ("server", "ha", "prometheus_client", "yaml")

pytestmark = pytest.mark.timeout(60)


def loaded_modules(code: str) -> list[str]:
    """Every module a fresh interpreter loads to run ``code`` (from ``-X importtime``)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=50,
    )
    # Lines read "import time: <self us> | <cumulative us> | <indented module name>".
    return [
        line.rsplit("|", 1)[1].strip()
        for line in run.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    ]


def forbidden(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".", 1)[0] in FORBIDDEN]


@pytest.mark.parametrize(
    "code",
    [
        "import fairshare.client",
        "from fairshare.client import AllocatorClient, SyncAllocatorClient",
    ],
)
def test_the_client_loads_no_server_module(code: str) -> None:
    modules = loaded_modules(code)
    assert "fairshare.client.allocator" in modules, "the import did not run"
    assert forbidden(modules) == []


def test_the_check_sees_a_server_import() -> None:
    """The check itself: importing the server does load it."""
    assert "server" in forbidden(loaded_modules("import server.app"))


def test_the_old_top_level_names_are_gone() -> None:
    """Installed names are fairshare, ha and server only: no shim keeps an old one."""
    for old in ("client", "wire", "gateway", "sim", "cli"):
        run = subprocess.run(
            [sys.executable, "-c", f"import {old}"],
            capture_output=True,
            cwd="/",
            timeout=50,
            check=False,
        )
        assert run.returncode != 0, f"`import {old}` still works"


def test_the_wheel_installs_only_its_three_names() -> None:
    """The packages setuptools finds with pyproject.toml's rules have three top-level names
    (a pattern like ``ha*`` also took ``harness``, which is not shipped)."""
    import tomllib
    from pathlib import Path

    from setuptools import find_packages

    root = Path(__file__).resolve().parents[2]
    rules = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = find_packages(str(root), include=rules["packages"]["find"]["include"])
    assert {name.split(".")[0] for name in found} == {"fairshare", "ha", "server"}
    assert "fairshare.wire.pb.fairshare.v1" in found and "ha.store.etcd" in found
