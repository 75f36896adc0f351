"""The API keys file: which team (and service class) each bearer key stands for.

Format (YAML)::

    keys:
      "sk-team-a-1": {team: inst-a, class: interactive}
      "sk-team-b-1": {team: inst-b}          # class: interactive by default

Guarantees:
- ``KeysFile.lookup`` answers from the keys loaded now; the comparison looks the key up in
  a dict (keys are secrets of high entropy, not passwords).
- The file is followed: when it is replaced or rewritten (as Kubernetes does with a mounted
  Secret) it is read again at the first lookup ``recheck_s`` (1 s) or more after the last
  look at it (a stat of inode, size and change time: ``fairshare.filewatch``), without a
  restart. A replacement that cannot be read or is not valid leaves the previous keys in
  force and is logged.

Non-guarantees: a removed key is refused from the next re-read on, not before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from fairshare import Class
from fairshare.filewatch import Followed

logger = logging.getLogger(__name__)

CLASSES = {"interactive": Class.INTERACTIVE, "batch": Class.BATCH}
"""The service classes by the names a keys file or a class header uses."""


class KeysFileError(ValueError):
    """The keys file cannot be used; the message says where."""


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


def parse_keys(text: str, source: str) -> dict[str, Identity]:
    """The keys of a keys file's text.

    Raises:
        KeysFileError: not YAML, not the format above, or a key listed without a team.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise KeysFileError(f"{source}: not valid YAML: {e}") from e
    if not isinstance(data, Mapping) or not isinstance(data.get("keys"), Mapping):
        raise KeysFileError(f"{source}: expected a mapping with a 'keys' mapping")
    keys: dict[str, Identity] = {}
    for key, entry in data["keys"].items():
        where = f"{source}: keys[{str(key)[:6]}...]"
        if not isinstance(key, str) or not key:
            raise KeysFileError(f"{where}: a key must be a non-empty string")
        if not isinstance(entry, Mapping) or not isinstance(entry.get("team"), str):
            raise KeysFileError(f"{where}: expected {{team: NAME, class: ...}}")
        unknown = set(entry) - {"team", "class"}
        if unknown:
            raise KeysFileError(f"{where}: unknown field {sorted(map(str, unknown))[0]}")
        team = entry["team"].strip()
        if not team:
            raise KeysFileError(f"{where}: team is empty")
        cls = parse_class(str(entry.get("class", "interactive")), where)
        keys[key] = Identity(team=team, service_class=cls)
    return keys


def read_keys(path: Path) -> dict[str, Identity]:
    """The keys of the file at ``path``.

    Raises:
        KeysFileError: it cannot be read or is not valid.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise KeysFileError(f"cannot read {path}: {e.strerror or e}") from e
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
        """The identity ``key`` stands for, or None."""
        return self._keys().get(key)

    def _reread(self, previous: dict[str, Identity], keys: dict[str, Identity]) -> None:
        logger.info("API keys re-read from %s: %d keys", self._path, len(keys))

    def _kept(self, error: Exception) -> None:
        logger.warning("keeping the previous API keys: %s", error)
