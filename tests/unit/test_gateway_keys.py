"""fairshare.gateway.keys and .identity: the keys file, followed; who a request is for."""

from __future__ import annotations

import hashlib
import io
import os
import time
from dataclasses import replace
from ipaddress import ip_network
from pathlib import Path

import pytest

from fairshare import Class
from fairshare.gateway.config import AuthSettings
from fairshare.gateway.identity import (
    FAIRNESS_ID_HEADER,
    BadClass,
    Unauthorized,
    bearer_key,
    identify,
    trusted,
)
from fairshare.gateway.keys import (
    Identity,
    KeysFile,
    KeysFileError,
    hash_key,
    hash_key_main,
    key_digest,
    parse_keys,
)

KEYS = """
keys:
  "sk-a": {team: inst-a, class: interactive}
  "sk-b": {team: inst-b, class: batch}
  "sk-c": {team: inst-c}
"""


def test_parse_keys() -> None:
    keys = parse_keys(KEYS, "keys.yaml")
    assert keys == {
        key_digest("sk-a"): Identity("inst-a", Class.INTERACTIVE),
        key_digest("sk-b"): Identity("inst-b", Class.BATCH),
        key_digest("sk-c"): Identity("inst-c", Class.INTERACTIVE),
    }


def test_hashed_entries_beside_plain_ones(tmp_path: Path) -> None:
    hashed = hash_key("sk-hashed")
    assert hashed == "sha256:" + hashlib.sha256(b"sk-hashed").hexdigest()
    path = tmp_path / "keys.yaml"
    path.write_text(
        f'keys:\n  "sk-a": {{team: inst-a}}\n  "{hashed.upper().replace("SHA256", "sha256")}":'
        " {team: inst-h, class: batch}\n"
    )
    keys = KeysFile(path)
    assert keys.lookup("sk-hashed") == Identity("inst-h", Class.BATCH)
    assert keys.lookup("sk-a") == Identity("inst-a")
    assert keys.lookup(hashed) is None  # the digest is not a key
    assert keys.lookup("sk-hashe") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("keys: [", "keys.yaml line 1, column 8: not valid YAML"),
        ("nokeys: {}", "keys.yaml: expected a mapping with a 'keys' mapping"),
        ('keys: {"sk-a": {class: batch}}', "keys.yaml line 1: expected {team"),
        ('keys: {"sk-a": {team: a, class: urgent}}', "keys.yaml line 1: class must be"),
        ('keys: {"sk-a": {team: a, colour: red}}', "keys.yaml line 1: unknown field colour"),
        ('keys: {"sk-a": {team: "  "}}', "keys.yaml line 1: team is empty"),
        (
            "keys:\n  sk-a: {team: a}\n  sk-a: {team: b}\n",
            "keys.yaml line 3: the same key as line 2",
        ),
        (
            f"keys:\n  sk-a: {{team: a}}\n  {hash_key('sk-a')}: {{team: b}}\n",
            "keys.yaml line 3: the same key as line 2",
        ),
        ("keys:\n  sha256:abc: {team: a}\n", "keys.yaml line 2: a sha256: entry is followed"),
        ('keys:\n  " sk-a": {team: a}\n', "keys.yaml line 2: a key cannot begin or end"),
        ("keys:\n  123456: {team: a}\n", "keys.yaml line 2: a key must be a non-empty string"),
    ],
)
def test_bad_keys_files(text: str, message: str) -> None:
    with pytest.raises(KeysFileError) as raised:
        parse_keys(text, "keys.yaml")
    assert str(raised.value).startswith(message), raised.value


@pytest.mark.parametrize(
    "text",
    [
        'keys:\n  "sk-SECRET-1": {team: a\n',  # the flow mapping never ends
        'keys:\n  "sk-SECRET-1": {team: a, class: urgent}\n',
        'keys:\n  "sk-SECRET-1": {team: a}\n  "sk-SECRET-1": {team: b}\n',
        'keys:\n  "sk-SECRET-1": [team, a]\n',
        "keys:\n  sk-SECRET-1: {team: a}\n  sk-SECRET-2 {team: b}\n  x: y: z\n",
        'keys:\n  "sk-SECRET-1": !secret {team: a}\n',
    ],
)
def test_errors_carry_no_key_material(text: str) -> None:
    """Not the key, nor any part of it: PyYAML's own messages quote the offending line."""
    with pytest.raises(KeysFileError) as raised:
        parse_keys(text, "keys.yaml")
    message = str(raised.value)
    assert "SECRET" not in message and "sk-" not in message, message
    error = raised.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert message.startswith("keys.yaml line "), message


def test_hash_key_command() -> None:
    out = io.StringIO()
    assert hash_key_main([], stdin=io.StringIO(" sk-a \n\nsk-b\n"), stdout=out) == 0
    assert out.getvalue() == f"{hash_key('sk-a')}\n{hash_key('sk-b')}\n"
    assert hash_key_main([], stdin=io.StringIO("\n"), stdout=io.StringIO()) == 2


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


LOCAL = "127.0.0.1"


def test_identify(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    keys = KeysFile(path)
    both = AuthSettings(team_header="x-team", class_header="x-class")

    def who(headers: dict[str, str], peer: str | None = LOCAL, **settings: object) -> Identity:
        auth = replace(both, **settings)  # type: ignore[arg-type]
        return identify(headers, peer=peer, auth=auth, keys=keys)

    assert who({"authorization": "Bearer sk-b"}) == Identity("inst-b", Class.BATCH)
    # A known key wins over the header, and its class over the class header.
    assert who(
        {"authorization": "Bearer sk-b", "x-team": "t", "x-class": "interactive"}
    ) == Identity("inst-b", Class.BATCH)
    # A presented key that is not known is refused, whatever header comes with it.
    for authorization in ("Bearer sk-unknown", "Basic c2stYg==", "Bearer ", ""):
        with pytest.raises(Unauthorized) as raised:
            who({"authorization": authorization, "x-team": "t"})
        assert "sk-" not in str(raised.value)
    # Without a key: the header, from a trusted peer only.
    assert who({"x-team": "t", "x-class": "batch"}) == Identity("t", Class.BATCH)
    with pytest.raises(Unauthorized, match="trusted_peers"):
        who({"x-team": "t"}, peer="192.0.2.7")
    with pytest.raises(Unauthorized):
        who({"x-team": "t"}, peer=None)
    assert who({"x-team": "t"}, peer="192.0.2.7", trusted_peers=(ip_network("192.0.2.0/24"),))
    with pytest.raises(BadClass):
        who({"x-team": "t", "x-class": "urgent"})
    # Without a keys file, the Authorization header names nobody and is not looked at.
    assert identify(
        {"authorization": "Bearer sk-unknown", "x-team": "t"}, peer=LOCAL, auth=both, keys=None
    ) == Identity("t")
    # Neither: no identity (401).
    with pytest.raises(Unauthorized):
        who({})
    with pytest.raises(Unauthorized):
        identify({"x-team": "t"}, peer=LOCAL, auth=AuthSettings(), keys=keys)


def test_fairness_id_is_a_team_source_when_on() -> None:
    fairness = {FAIRNESS_ID_HEADER: "t-f"}
    off = AuthSettings(team_header="x-team")
    with pytest.raises(Unauthorized):
        identify(fairness, peer=LOCAL, auth=off, keys=None)
    on = replace(off, fairness_id=True, class_header="x-class")
    assert identify({**fairness, "x-class": "batch"}, peer=LOCAL, auth=on, keys=None) == (
        Identity("t-f", Class.BATCH)
    )
    # The team header first; the same trust as the team header.
    assert identify({**fairness, "x-team": "t"}, peer=LOCAL, auth=on, keys=None).team == "t"
    with pytest.raises(Unauthorized):
        identify(fairness, peer="192.0.2.7", auth=on, keys=None)


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("/run/gateway.sock", False),
        (None, False),
    ],
)
def test_trusted_peers_default_to_loopback(peer: str | None, expected: bool) -> None:
    assert trusted(peer, AuthSettings().trusted_peers) is expected
