"""The API keys file: which team (and service class) each bearer key stands for.

Format (YAML)::

    keys:
      "sk-team-a-1": {team: inst-a, class: interactive}
      "sk-team-b-1": {team: inst-b}          # class: interactive by default
      # "sk-team-c-1", hashed:
      "sha256:9db76129168d40d20a8dae5961cd0a4233f3aac3691ff4cbeb828155da45f4e1": {team: inst-c}

A key is listed as it is, or hashed: ``sha256:`` and the 64 hex digits of the SHA-256 of
its UTF-8 bytes (``hash_key``; ``fairshare gateway hash-key`` prints it for a key read
from stdin, as does ``printf %s "$KEY" | sha256sum``). The two forms may be mixed.

Guarantees:
- A key is held only as its SHA-256 digest, whichever form the file lists it in.
  ``KeysFile.lookup`` hashes the presented key and looks its digest up: how long a lookup
  takes depends on that digest only, never on how much of a stored key the presented one
  matches, and a digest tells nothing of the key behind it.
- No error message carries key material: an error names the file and the line of the
  entry, and a YAML error its line and column, never the text of the line (PyYAML's own
  message quotes it, so it is neither used nor chained).
- The file is followed: when it is replaced or rewritten (as Kubernetes does with a mounted
  Secret) it is read again at the first lookup ``recheck_s`` (1 s) or more after the last
  look at it (a stat of inode, size and change time: ``fairshare.filewatch``), without a
  restart. A replacement that cannot be read or is not valid leaves the previous keys in
  force and is logged.

Non-guarantees: a removed key is refused from the next re-read on, not before.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

import yaml

from fairshare import Class
from fairshare.filewatch import Followed

logger = logging.getLogger(__name__)

CLASSES = {"interactive": Class.INTERACTIVE, "batch": Class.BATCH}
"""The service classes by the names a keys file or a class header uses."""
HASHED: Final = "sha256:"
"""The prefix of a hashed entry of the keys file."""
DIGEST_HEX: Final = 2 * hashlib.sha256().digest_size


class KeysFileError(ValueError):
    """The keys file cannot be used; the message says where (never with key material)."""


@dataclass(frozen=True)
class Identity:
    """Who a request is for: its team and service class."""

    team: str
    service_class: Class = Class.INTERACTIVE


def parse_class(text: str, where: str) -> Class:
    """The class named ``text`` ("interactive" | "batch", any case).

    Raises:
        KeysFileError: another name.
    """
    try:
        return CLASSES[text.strip().lower()]
    except KeyError:
        raise KeysFileError(
            f"{where}: class must be one of {', '.join(CLASSES)}, got {text!r}"
        ) from None


def key_digest(key: str) -> bytes:
    """The SHA-256 digest of ``key``'s UTF-8 bytes (a header's undecodable bytes as sent)."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def hash_key(key: str) -> str:
    """The hashed keys-file entry of ``key``: ``sha256:<hex>``."""
    return HASHED + key_digest(key).hex()


def _entry_digest(key: object, where: str) -> bytes:
    """The digest an entry's key stands for, plain or hashed."""
    if not isinstance(key, str) or not key.strip():
        raise KeysFileError(f"{where}: a key must be a non-empty string")
    if key.startswith(HASHED):
        hexdigits = key[len(HASHED) :]
        if len(hexdigits) != DIGEST_HEX or not set(hexdigits) <= set(string.hexdigits):
            raise KeysFileError(
                f"{where}: a {HASHED} entry is followed by the key's SHA-256, "
                f"{DIGEST_HEX} hex digits"
            )
        return bytes.fromhex(hexdigits)
    if key != key.strip():
        raise KeysFileError(f"{where}: a key cannot begin or end with white space")
    return key_digest(key)


def _identity(entry: object, where: str) -> Identity:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("team"), str):
        raise KeysFileError(f"{where}: expected {{team: NAME, class: ...}}")
    unknown = set(entry) - {"team", "class"}
    if unknown:
        raise KeysFileError(f"{where}: unknown field {sorted(map(str, unknown))[0]}")
    team = entry["team"].strip()
    if not team:
        raise KeysFileError(f"{where}: team is empty")
    return Identity(
        team=team, service_class=parse_class(str(entry.get("class", "interactive")), where)
    )


def _yaml_error(error: yaml.YAMLError, source: str) -> KeysFileError:
    """The error of a YAML error, placed by line and column only."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None:
        return KeysFileError(f"{source}: not valid YAML")
    return KeysFileError(
        f"{source} line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    )


def _keys_node(root: yaml.Node | None, source: str) -> yaml.MappingNode:
    found = (
        [v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "keys"]
        if isinstance(root, yaml.MappingNode)
        else []
    )
    if len(found) != 1 or not isinstance(found[0], yaml.MappingNode):
        raise KeysFileError(f"{source}: expected a mapping with a 'keys' mapping")
    return found[0]


def parse_keys(text: str, source: str) -> dict[bytes, Identity]:
    """The keys of a keys file's text, by digest (``key_digest``).

    Raises:
        KeysFileError: not YAML, not the format above, a key listed without a team, or a
            key listed twice (plain, hashed or both).
    """
    loader = yaml.SafeLoader(text)
    try:
        node = _keys_node(loader.get_single_node(), source)
        loader.flatten_mapping(node)
        keys: dict[bytes, Identity] = {}
        lines: dict[bytes, int] = {}
        for key_node, entry_node in node.value:
            line = key_node.start_mark.line + 1
            where = f"{source} line {line}"
            digest = _entry_digest(loader.construct_object(key_node, deep=True), where)
            if digest in keys:
                raise KeysFileError(f"{where}: the same key as line {lines[digest]}")
            keys[digest] = _identity(loader.construct_object(entry_node, deep=True), where)
            lines[digest] = line
        return keys
    except yaml.YAMLError as e:
        raise _yaml_error(e, source) from None
    finally:
        loader.dispose()


def read_keys(path: Path) -> dict[bytes, Identity]:
    """The keys of the file at ``path``.

    Raises:
        KeysFileError: it cannot be read or is not valid.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8"
        raise KeysFileError(f"cannot read {path}: {reason or e}") from None
    return parse_keys(text, str(path))


class KeysFile:
    """The keys of one file, followed for replacements (see the module doc)."""

    def __init__(self, path: str | Path, *, recheck_s: float = 1.0) -> None:
        """Reads the file now.

        Raises:
            KeysFileError: it cannot be read or is not valid (at start this is fatal).
        """
        self._path = Path(path)
        self._keys = Followed(
            [self._path],
            lambda: read_keys(self._path),
            keep_on=(KeysFileError,),
            recheck_s=recheck_s,
            on_read=self._reread,
            on_kept=self._kept,
        )

    def __len__(self) -> int:
        return len(self._keys())

    def lookup(self, key: str) -> Identity | None:
        """The identity ``key`` stands for, or None (looked up by its digest)."""
        return self._keys().get(key_digest(key))

    def _reread(self, previous: dict[bytes, Identity], keys: dict[bytes, Identity]) -> None:
        logger.info("API keys re-read from %s: %d keys", self._path, len(keys))

    def _kept(self, error: Exception) -> None:
        logger.warning("keeping the previous API keys: %s", error)


def hash_key_main(
    argv: Sequence[str], *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """``fairshare gateway hash-key``: the hashed entry of each key read from stdin, one a
    line (blank lines skipped, white space around a key dropped as the gateway drops it
    from a presented key). Returns the exit status: 2 when stdin holds no key."""
    parser = argparse.ArgumentParser(
        prog="fairshare gateway hash-key",
        description="Print the keys-file entry (sha256:<hex>) of each API key read from "
        "stdin, one key a line; the key itself is never printed.",
    )
    parser.parse_args(list(argv))
    source = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout
    keys = [line.strip() for line in source.read().splitlines() if line.strip()]
    if not keys:
        print("fairshare gateway hash-key: no key on stdin", file=sys.stderr)
        return 2
    for key in keys:
        print(hash_key(key), file=out)
    return 0
