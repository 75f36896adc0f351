"""The import contracts in pyproject.toml catch what they forbid.

Each case copies the packages the contracts cover and pyproject.toml into a temporary
directory, adds one forbidden import to one module of the copy and runs the virtualenv's
``lint-imports`` there: it must fail and name the contract that the import breaks. The
unmodified copy must keep every contract, so a failure is the injected import's doing.

To cover a new contract, add a row to ``CASES``: the module to change, the import to add
and the contract's name as pyproject.toml spells it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CORE = "The decision core does no I/O"
ABOVE = "The decision core imports nothing above it"
LAYERS = "Layers: cli -> sim -> server, gateway, integrations -> ha, client -> wire"
INTEGRATIONS = "The integrations use the client library only"
HA = "ha does not speak gRPC or read config files"
HARNESS = "No shipped package imports the test harness"
LIGHT = "The client library and the wire protocol stay out of the server"
SERVER_CLIENT = "The server does not use the client library"
ROOMS = "Rooms of ha: node -> routing -> stubs -> cluster -> owned -> store"
SERVER_HA = "The server imports only ha's public API"

CASES = [
    pytest.param("fairshare/pool.py", "import os", CORE, id="core-os"),
    pytest.param("fairshare/apportion.py", "import yaml", CORE, id="core-yaml"),
    pytest.param("fairshare/priority.py", "from pathlib import Path", CORE, id="core-pathlib"),
    pytest.param("fairshare/limits.py", "import logging.handlers", CORE, id="core-log-handlers"),
    pytest.param("fairshare/shares.py", "import subprocess", CORE, id="core-subprocess"),
    pytest.param("fairshare/pool.py", "import fairshare.filewatch", ABOVE, id="core-follows"),
    pytest.param("fairshare/__init__.py", "import fairshare.filewatch", ABOVE, id="init-follows"),
    pytest.param("fairshare/ids.py", "import fairshare.client.grants", ABOVE, id="core-client"),
    pytest.param("fairshare/__init__.py", "import ha.settings", ABOVE, id="init-ha"),
    pytest.param("ha/clock.py", "import grpc", HA, id="ha-grpc"),
    pytest.param("ha/node.py", "import grpc", HA, id="ha-grpc-importer-of-etcd"),
    pytest.param("ha/store/etcd/__init__.py", "import grpc", HA, id="ha-grpc-etcd-init"),
    pytest.param("ha/settings.py", "import yaml", HA, id="ha-yaml"),
    pytest.param("ha/store/contract.py", "import ha.owned.pool", ROOMS, id="store-up"),
    pytest.param("ha/owned/held.py", "import ha.cluster.view", ROOMS, id="owned-up"),
    pytest.param("ha/api.py", "import ha.node", ROOMS, id="api-up"),
    pytest.param("server/app.py", "import ha.node", SERVER_HA, id="server-ha-room"),
    pytest.param("server/metrics.py", "import ha.api", SERVER_HA, id="server-ha-api"),
    pytest.param("ha/owned/pool.py", "import prometheus_client", HA, id="ha-prometheus"),
    pytest.param("server/app.py", "from harness import serve", HARNESS, id="server-harness"),
    pytest.param("fairshare/client/calls.py", "import server.metrics", LIGHT, id="client-server"),
    pytest.param(
        "fairshare/client/grants.py", "import prometheus_client", LIGHT, id="client-prometheus"
    ),
    pytest.param("fairshare/wire/convert.py", "import yaml", LIGHT, id="wire-yaml"),
    pytest.param("fairshare/client/sync.py", "import fairshare.sim", LAYERS, id="client-sim"),
    pytest.param("fairshare/wire/convert.py", "import fairshare.client", LAYERS, id="wire-up"),
    pytest.param("server/peers.py", "import fairshare.client", SERVER_CLIENT, id="server-client"),
    pytest.param(
        "fairshare/integrations/litellm.py",
        "import fairshare.gateway.body",
        INTEGRATIONS,
        id="integrations-gateway",
    ),
    pytest.param(
        "fairshare/integrations/litellm_config.py",
        "import ha.api",
        INTEGRATIONS,
        id="integrations-ha",
    ),
    pytest.param(
        "fairshare/cost.py", "import fairshare.integrations", ABOVE, id="core-integrations"
    ),
]


@pytest.fixture
def copy(tmp_path: Path) -> Iterator[Path]:
    """A fresh copy of the project's packages and pyproject.toml, removed afterwards."""
    target = tmp_path / "copy"
    target.mkdir()
    _copy_project(target)
    yield target
    shutil.rmtree(target)


def _copy_project(target: Path) -> None:
    """Copies pyproject.toml and every root package its import contracts name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for package in config["tool"]["importlinter"]["root_packages"]:
        shutil.copytree(
            ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy2(ROOT / "pyproject.toml", target / "pyproject.toml")


def _lint_imports(where: Path) -> subprocess.CompletedProcess[str]:
    """Runs lint-imports on the copy in ``where``, its config and its packages only."""
    assert LINT_IMPORTS.is_file(), f"no lint-imports beside {sys.executable}"
    env = {**os.environ, "PYTHONPATH": str(where), "NO_COLOR": "1"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", "pyproject.toml", "--no-cache"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_unmodified_copy_keeps_every_contract(copy: Path) -> None:
    result = _lint_imports(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize(("path", "statement", "contract"), CASES)
def test_a_forbidden_import_breaks_its_contract(
    copy: Path, path: str, statement: str, contract: str
) -> None:
    module_file = copy / path
    assert module_file.is_file(), f"{path} is not in the copy"
    with module_file.open("a", encoding="utf-8") as f:
        f.write(f"\n{statement}  # injected by the test\n")

    result = _lint_imports(copy)

    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    broken = output.partition("Broken contracts")[2]
    assert contract in broken, output
    module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    imported = statement.split()[1].partition(".")[0]  # external packages are seen whole
    assert f"{module} -> {imported}" in broken, output


def test_the_core_contracts_name_every_module_of_the_core() -> None:
    """The core's contracts name its modules one by one (a package would contain the
    layers above it): a new module of the core is in both, or this fails."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}
    beside = {"fairshare.filewatch"}
    core = {
        f"fairshare.{p.stem}" for p in (ROOT / "fairshare").glob("*.py") if p.stem != "__init__"
    }
    for name in (CORE, ABOVE):
        assert set(contracts[name]["source_modules"]) == {"fairshare"} | core - beside, name
