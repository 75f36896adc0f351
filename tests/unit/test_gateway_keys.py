"""fairshare.gateway.keys and .identity: the keys file, followed; who a request is for."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fairshare import Class
from fairshare.gateway.config import AuthSettings
from fairshare.gateway.identity import BadClass, bearer_key, identify
from fairshare.gateway.keys import Identity, KeysFile, KeysFileError, parse_keys

KEYS = """
keys:
  "sk-a": {team: inst-a, class: interactive}
  "sk-b": {team: inst-b, class: batch}
  "sk-c": {team: inst-c}
"""


def test_parse_keys() -> None:
    keys = parse_keys(KEYS, "keys.yaml")
    assert keys == {
        "sk-a": Identity("inst-a", Class.INTERACTIVE),
        "sk-b": Identity("inst-b", Class.BATCH),
        "sk-c": Identity("inst-c", Class.INTERACTIVE),
    }


@pytest.mark.parametrize(
    "text",
    [
        "keys: [",
        "nokeys: {}",
        'keys: {"sk-a": {class: batch}}',
        'keys: {"sk-a": {team: a, class: urgent}}',
        'keys: {"sk-a": {team: a, colour: red}}',
        'keys: {"sk-a": {team: "  "}}',
    ],
)
def test_bad_keys_files(text: str) -> None:
    with pytest.raises(KeysFileError):
        parse_keys(text, "keys.yaml")


def test_the_file_is_followed_when_replaced(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    keys = KeysFile(path, recheck_s=0.0)
    assert keys.lookup("sk-a") == Identity("inst-a")
    # Replaced as Kubernetes does: a new file renamed over the old one.
    new = tmp_path / "keys.new"
    new.write_text('keys: {"sk-d": {team: inst-d, class: batch}}\n')
    os.replace(new, path)
    assert keys.lookup("sk-a") is None
    assert keys.lookup("sk-d") == Identity("inst-d", Class.BATCH)
    # A broken replacement keeps the keys in force.
    path.write_text("keys: [")
    assert keys.lookup("sk-d") == Identity("inst-d", Class.BATCH)


def test_lookups_within_recheck_do_not_look_at_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    keys = KeysFile(path, recheck_s=3600.0)
    path.write_text('keys: {"sk-z": {team: z}}\n')
    time.sleep(0.01)
    assert keys.lookup("sk-a") is not None and keys.lookup("sk-z") is None


def test_bearer_key() -> None:
    assert bearer_key("Bearer sk-a") == "sk-a"
    assert bearer_key("bearer  sk-a ") == "sk-a"
    assert bearer_key("Basic xyz") is None
    assert bearer_key(None) is None
    assert bearer_key("Bearer ") is None


def test_identify(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    keys = KeysFile(path)
    both = AuthSettings(team_header="x-team", class_header="x-class")
    assert identify({"authorization": "Bearer sk-b"}, auth=both, keys=keys) == Identity(
        "inst-b", Class.BATCH
    )
    # A known key wins over the header, and its class over the class header.
    assert identify(
        {"authorization": "Bearer sk-b", "x-team": "t", "x-class": "interactive"},
        auth=both,
        keys=keys,
    ) == Identity("inst-b", Class.BATCH)
    # Without a known key: the header.
    assert identify(
        {"authorization": "Bearer sk-unknown", "x-team": "t", "x-class": "batch"},
        auth=both,
        keys=keys,
    ) == Identity("t", Class.BATCH)
    assert identify({"x-team": "t"}, auth=both, keys=None) == Identity("t")
    with pytest.raises(BadClass):
        identify({"x-team": "t", "x-class": "urgent"}, auth=both, keys=keys)
    # Neither: no identity (401).
    assert identify({}, auth=both, keys=keys) is None
    assert identify({"x-team": "t"}, auth=AuthSettings(), keys=keys) is None
