"""requirements.lock pins every dependency pyproject.toml names, each within its range.

pyproject.toml declares ranges (what the library accepts); requirements.lock holds the
exact versions `make venv`, CI and the image install (`make lock` writes it). A dependency
added to pyproject.toml without `make lock`, or a range moved past its pin, fails here.

The ``litellm`` extra is installed into LiteLLM's proxy, never the project's virtualenv: its
pins are bench/litellm-requirements.txt's, and requirements.lock holds no litellm.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _declared() -> list[tuple[str, Requirement]]:
    """(where, requirement) for the base dependencies and every extra's, without the
    project's references to its own extras."""
    found = [("dependencies", Requirement(line)) for line in PROJECT["dependencies"]]
    for extra, lines in PROJECT["optional-dependencies"].items():
        found += [(f"extra {extra}", Requirement(line)) for line in lines]
    own = canonicalize_name(PROJECT["name"])
    return [(where, req) for where, req in found if canonicalize_name(req.name) != own]


APART = {"extra litellm": ROOT / "bench" / "litellm-requirements.txt"}
"""The extras pinned in a file of their own, not requirements.lock."""


def _locked(path: Path = ROOT / "requirements.lock") -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"not an exact pin: {raw!r}"
        pins[canonicalize_name(name.partition("[")[0])] = Version(version)
    return pins


DECLARED = _declared()


def test_every_extra_is_declared_and_the_base_is_the_client_library() -> None:
    assert set(PROJECT["optional-dependencies"]) >= {"server", "sim", "dev"}
    base = {canonicalize_name(Requirement(line).name) for line in PROJECT["dependencies"]}
    assert base == {"sortedcontainers", "grpcio", "protobuf", "tenacity"}


@pytest.mark.parametrize(
    ("where", "req"), [pytest.param(where, req, id=f"{where}: {req}") for where, req in DECLARED]
)
def test_the_lock_pins_each_dependency_within_its_range(where: str, req: Requirement) -> None:
    pins = _locked(APART[where]) if where in APART else _locked()
    name = canonicalize_name(req.name)
    assert name in pins, f"{req.name} is not in requirements.lock: run `make lock`"
    assert req.specifier.contains(pins[name], prereleases=True), (
        f"requirements.lock pins {req.name}=={pins[name]}, outside {req.specifier}"
    )


def test_the_lock_holds_no_litellm() -> None:
    assert "litellm" not in _locked(), "the project's virtualenv stays without LiteLLM"


def test_no_dependency_is_an_exact_pin_in_pyproject() -> None:
    pinned = [str(req) for _, req in DECLARED if any(s.operator == "==" for s in req.specifier)]
    assert not pinned, f"exact pins belong in requirements.lock: {pinned}"
