"""The generated code in fairshare/wire/pb is what `make proto` produces from proto/ today."""

from __future__ import annotations

import pathlib

import pytest

from fairshare.wire import genproto

pytestmark = pytest.mark.timeout(30)


def test_generated_code_is_fresh(tmp_path: pathlib.Path) -> None:
    written = genproto.generate(tmp_path)
    assert written, "no .proto files found"
    stale = [
        str(rel)
        for rel in written
        if not (genproto.OUT_DIR / rel).is_file()
        or (genproto.OUT_DIR / rel).read_text("utf-8") != (tmp_path / rel).read_text("utf-8")
    ]
    assert not stale, f"fairshare/wire/pb is stale ({', '.join(stale)}): run `make proto`"
    committed = {p.relative_to(genproto.OUT_DIR) for p in genproto.OUT_DIR.rglob("*.py*")}
    extra = sorted(str(p) for p in committed - set(written) if "__pycache__" not in str(p))
    assert not extra, f"fairshare/wire/pb holds files no .proto generates: {extra}"


def test_generated_imports_do_not_shadow_the_core() -> None:
    for path in genproto.OUT_DIR.rglob("*.py"):
        assert "from fairshare.v1 import" not in path.read_text("utf-8"), path
