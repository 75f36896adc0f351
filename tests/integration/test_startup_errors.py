"""A ``fairshare serve`` that cannot start says why in one line naming the file, exits with
status 2, and prints no traceback."""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Callable

import pytest

from ha.store.file import FileStore
from harness.serve import run_serve, serve_args

from .conftest import POOLS_YAML
from .test_full_disk import fill

pytestmark = pytest.mark.timeout(60)


def _serve(config: pathlib.Path, state: pathlib.Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSHARE_")}
    args = serve_args(config, listen="127.0.0.1:0", state_dir=state)
    return run_serve(args, timeout_s=30, env=environ)


def _state_a_file(tmp: pathlib.Path) -> pathlib.Path:
    state = tmp / "state"
    state.write_text("not a folder")
    return state


def _corrupt_record(tmp: pathlib.Path) -> pathlib.Path:
    state = tmp / "state"
    state.mkdir()
    log = state / FileStore.LOG_NAMES[0]
    log.write_bytes(
        b'00000000 {"r":2,"k":"/fairshare/x","v":"eA==","c":2}\n'  # wrong checksum
        b'{"r":3,"k":"/fairshare/y","v":"eA==","c":3}\n'
    )
    return log


def _bad_pem(tmp: pathlib.Path) -> pathlib.Path:
    cert = tmp / "server.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    (tmp / "server.key").write_text("garbage\n")
    return cert


CASES: list[tuple[str, Callable[[pathlib.Path], pathlib.Path], str]] = [
    ("state-dir-is-a-file", _state_a_file, "not a directory"),
    ("corrupt-record", _corrupt_record, "corrupt record at byte offset 0"),
    ("bad-pem", _bad_pem, "not a readable PEM"),
]


@pytest.mark.parametrize(("make", "says"), [pytest.param(m, s, id=i) for i, m, s in CASES])
def test_a_start_that_cannot_happen_exits_2_with_one_line_naming_the_file(
    tmp_path: pathlib.Path, make: Callable[[pathlib.Path], pathlib.Path], says: str
) -> None:
    named = make(tmp_path)
    tls = ""
    if named.suffix == ".crt":
        tls = f"tls: {{cert_file: {named}, key_file: {named.with_suffix('.key')}}}\n"
    config = tmp_path / "pools.yaml"
    config.write_text(f"node_id: s-0\n{tls}{POOLS_YAML}", encoding="utf-8")
    done = _serve(config, tmp_path / "state")
    _assert_one_line(done, str(named), says)


def test_a_config_that_is_not_utf8_exits_2_naming_it(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "pools.yaml"
    config.write_bytes(b"node_id: caf\xe9\n" + POOLS_YAML.encode())
    done = _serve(config, tmp_path / "state")
    _assert_one_line(done, str(config), "not UTF-8")


def test_a_full_disk_at_start_exits_2_naming_the_file(
    tmp_path: pathlib.Path, small_disk: pathlib.Path
) -> None:
    state = small_disk / "state"
    state.mkdir()
    fill(small_disk / "filler")
    config = tmp_path / "pools.yaml"
    config.write_text(f"node_id: s-0\n{POOLS_YAML}", encoding="utf-8")
    done = _serve(config, state)
    _assert_one_line(done, str(state), "no space left")


def _assert_one_line(done: subprocess.CompletedProcess[str], path: str, says: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("fairshare:")]
    assert len(lines) == 1, done.stderr
    assert path in lines[0] and says in lines[0], done.stderr
