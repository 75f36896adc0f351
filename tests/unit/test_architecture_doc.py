"""docs/architecture.md draws the imports the code has, and names code that exists.

The Mermaid block of the page is read as a list of arrows (``A --> B``: some module of ``A``
imports ``B``) and compared with the imports of the source, read with ``ast``:

- every arrow between two packages that exist is a real import (a drawn arrow may only
  name a package that does not exist yet, such as the gateway, when it is dashed or
  points at such a package);
- every import between the project's packages is drawn, so the picture is complete;
- no arrow points up the layers, and a sideways arrow is dashed (marked as the exception).

Every ``path.py:Name.attr`` the page cites, and every ``Class.attr`` of a project class, is
looked up in the source, and every import-linter contract the page quotes is one of
pyproject.toml's.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"

LEVEL = {
    "fairshare": 0,
    "wire": 1,
    "ha": 1,
    "client": 2,
    "server": 2,
    "gateway": 3,
    "integrations": 3,
    "sim": 3,
    "bench": 3,
    "cli": 4,
}
"""The layers as the page draws them; a package imports only lower levels."""
BESIDE = {"tests", "harness"}
"""Not layered: tests may import anything; harness imports nothing of the project."""
PACKAGES = set(LEVEL) | BESIDE
SUBPACKAGES = {"wire", "client", "gateway", "integrations", "sim", "cli"}
"""The parts the page draws on their own that live inside ``fairshare`` (``fairshare.client``
is drawn as ``client``); the rest of ``fairshare`` is the core."""


def folder(part: str) -> Path:
    return ROOT / "fairshare" / part if part in SUBPACKAGES else ROOT / part


def sources(part: str) -> list[Path]:
    """The modules of one drawn part (the core: ``fairshare``'s own modules only)."""
    if not exists(part):
        return []
    if part == "fairshare":
        return sorted((ROOT / "fairshare").glob("*.py"))
    return sorted(folder(part).rglob("*.py"))


def part_of(module: str) -> str | None:
    """The drawn part an imported module belongs to; None outside the project."""
    parts = module.split(".")
    if parts[0] == "fairshare" and len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1]
    if parts[0] in PACKAGES and parts[0] not in SUBPACKAGES:
        return parts[0]
    return None


pytestmark = pytest.mark.timeout(60)


def mermaid_edges() -> dict[tuple[str, str], bool]:
    """{(importer, imported): dashed} for each arrow of the page's Mermaid block."""
    block = re.search(r"```mermaid\n(.*?)```", PAGE.read_text(), re.S)
    assert block is not None, "docs/architecture.md has no mermaid block"
    edges: dict[tuple[str, str], bool] = {}
    arrow = re.compile(r"^\s*(\w+)\s*(-->|-\.->)(?:\|[^|]*\|)?\s*([\w\s&]+?)\s*$")
    for line in block.group(1).splitlines():
        m = arrow.match(line)
        if m is None:
            continue
        for target in m.group(3).split("&"):
            edges[(m.group(1), target.strip())] = m.group(2) == "-.->"
    assert edges, "no arrows read from the mermaid block"
    return edges


@cache
def imports() -> dict[tuple[str, str], list[str]]:
    """{(importer, imported): [where]} for absolute imports between project packages."""
    found: dict[tuple[str, str], list[str]] = {}
    for package in sorted(PACKAGES):
        for path in sources(package):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = part_of(name)
                    if top is not None and top != package:
                        where = f"{path.relative_to(ROOT)}: {name}"
                        found.setdefault((package, top), []).append(where)
    return found


def exists(package: str) -> bool:
    return folder(package).is_dir()


def test_every_arrow_is_a_real_import() -> None:
    for source, target in mermaid_edges():
        assert source in PACKAGES or source == "gateway", f"unknown package {source}"
        assert target in PACKAGES, f"unknown package {target}"
        if not (exists(source) and exists(target)):
            continue  # a package still to come (the gateway; the harness on older trees)
        assert (source, target) in imports(), f"{source} --> {target} is drawn but not imported"


def test_every_import_is_drawn() -> None:
    edges = mermaid_edges()
    missing = {
        f"{source} --> {target} ({where[0]})"
        for (source, target), where in imports().items()
        if (source, target) not in edges
    }
    assert missing == set()


def test_no_arrow_points_up() -> None:
    for (source, target), dashed in mermaid_edges().items():
        if source == "tests":
            continue
        assert source != "harness", "harness imports nothing of the project"
        assert target != "tests", f"{source} --> tests"
        if target == "harness":
            assert source in ("bench", "tests"), f"{source} --> harness: shipped code"
            continue
        assert LEVEL[source] >= LEVEL[target], f"{source} --> {target} points up"
        if LEVEL[source] == LEVEL[target]:
            assert dashed, f"{source} --> {target} is sideways: draw it dashed and say why"


@cache
def definitions(path: Path) -> dict[str, set[str]]:
    """{top-level name: its members} of one module ('' for a function or a variable)."""
    tree = ast.parse(path.read_text(), str(path))
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = names.setdefault(node.name, set())
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif (
                    isinstance(item, ast.Attribute)
                    and isinstance(item.value, ast.Name)
                    and item.value.id == "self"
                ):
                    members.add(item.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names[target.id] = set()
    return names


def cited() -> list[str]:
    return re.findall(r"`([^`\s]+)`", PAGE.read_text())


def test_every_cited_path_and_name_exists() -> None:
    for text in cited():
        m = re.fullmatch(r"((?:[\w]+/)+[\w.]*)(?::([\w.]+))?", text)
        if m is None or m.group(1).split("/")[0] not in PACKAGES | {"docs", "proto"}:
            continue
        path = ROOT / m.group(1)
        assert path.exists(), f"{text}: no such file"
        if m.group(2) is None:
            continue
        name, *attr = m.group(2).split(".")
        defined = definitions(path)
        assert name in defined, f"{text}: {name} is not defined in {m.group(1)}"
        if attr:
            assert attr[0] in defined[name], f"{text}: {name} has no {attr[0]}"


def test_every_cited_method_exists() -> None:
    classes: dict[str, set[str]] = {}
    for package in LEVEL:
        for path in sources(package):
            for name, members in definitions(path).items():
                if name[:1].isupper() and members:
                    classes.setdefault(name, set()).update(members)
    checked = 0
    for text in cited():
        m = re.fullmatch(r"(?:[\w/.]+:)?([A-Z]\w+)\.(\w+)", text)
        if m is None or m.group(1) not in classes:
            continue
        checked += 1
        assert m.group(2) in classes[m.group(1)], f"{text}: no such member"
    assert checked > 20, "the page cites methods; the pattern above no longer finds them"


def test_every_quoted_contract_is_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = {c["name"] for c in config["tool"]["importlinter"]["contracts"]}
    # A contract's name is a sentence; no other code span of the page starts like one.
    sentence = r"`((?:Layers:|Rooms |The |ha does |Nothing |No shipped )[^`]*)`"
    quoted = set(re.findall(sentence, PAGE.read_text()))
    assert quoted <= names, f"not contracts of pyproject.toml: {quoted - names}"
    assert names <= quoted, f"contracts the page does not name: {names - quoted}"


def test_the_plain_text_list_matches_the_mermaid_block() -> None:
    """The list of rows readable without a renderer names the same arrows."""
    text = PAGE.read_text()
    start = text.index("  row   package")
    rows = text[start : text.index("```", start)].split("\n\n")[0]
    listed: set[tuple[str, str]] = set()
    source = ""
    for line in rows.splitlines()[2:]:
        m = re.match(r"^\s*(?:\d\s+)?\(?(\w+)\)?\s{2,}(.*)$", line)
        if m is not None:
            source, imported = m.groups()
        else:
            imported = line.strip()
            m = re.match(r"\+ (\w+), sideways", imported)
            assert m is not None, f"unread line: {line!r}"
            imported = m.group(1)
        for name in re.findall(r"\b(\w+)\b", imported.split("(")[0]):
            if name in PACKAGES:
                listed.add((source, name))
    drawn = {edge for edge in mermaid_edges() if edge[0] != "tests"}
    assert listed == drawn
