"""The cluster's grant keys: they sign the grant ids replicas issue and check them back.

A grant id carries ``HMAC-SHA256(key, "fairshare grant v2\\n" + fields)`` truncated to
``ha.api.MAC_BYTES`` (see ``ha.api.GrantRef``). Every replica of a cluster holds the same
keys, so an id signed by one owner verifies on its successor.

Key file: UTF-8 text, one key a line; blank lines and lines starting with ``#`` are
skipped. The first key is the current one (it signs), the others are previous ones (they
only verify). A key is the line's bytes without surrounding whitespace, at least
``MIN_KEY_CHARS`` characters (e.g. ``openssl rand -base64 32``).

Guarantees:
- An id verifies only if its MAC was made by one of the keys loaded now; the comparison
  is in constant time.
- A key file is followed: when it is replaced or rewritten (as Kubernetes does with a
  mounted Secret) it is read again at the first sign or verify ``recheck_s`` (1 s) or
  more after the last look at it (``fairshare.filewatch``), without a restart. A
  replacement that cannot be read, or holds no valid key, leaves the previous keys in
  force and is logged.

Non-guarantees: ids signed with a key removed from the file stop verifying at once; an
operator keeps an old key listed for at least ``max_request_s`` (the longest a grant can
live) after it stops being the current one.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import importlib
import logging
import os
import pathlib
import secrets
from collections.abc import Callable, Sequence
from typing import Any, Final

from fairshare.filewatch import UNREAD, Followed, Unread
from ha.api import MAC_BYTES, GrantRef

logger = logging.getLogger(__name__)

MIN_KEY_CHARS: Final = 32
"""Shortest key accepted: 32 characters (at least 192 bits as base64)."""
GENERATED_KEY_FILE: Final = "grant.key"
"""The key file an embedded node keeps in its state directory when none is configured."""
_DOMAIN: Final = b"fairshare grant v2\n"


def _builtin_sha256() -> Callable[..., Any]:
    """CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before), else hashlib's.

    The MAC is the same with either; the built-in one is the faster here: in a replica's
    process (gRPC's threads, the store's) OpenSSL's HMAC measured 20 to 120 µs per id,
    against 7 to 11 µs for CPython's, and every Acquire signs an id and every Release
    checks one on the request path."""
    for name in ("_sha2", "_sha256"):
        with contextlib.suppress(ImportError):
            return importlib.import_module(name).sha256  # type: ignore[no-any-return]
    return hashlib.sha256


_SHA256: Final = _builtin_sha256()


class KeyFileError(ValueError):
    """A key file holds no usable key, or a key is too short; the message names the file."""


def parse_keys(text: str, source: str) -> list[bytes]:
    """The keys of a key file's text, current first.

    Raises:
        KeyFileError: no key, or a key shorter than ``MIN_KEY_CHARS``.
    """
    keys: list[bytes] = []
    for number, line in enumerate(text.splitlines(), start=1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if len(key) < MIN_KEY_CHARS:
            raise KeyFileError(
                f"{source}:{number}: a grant key must have at least {MIN_KEY_CHARS} "
                f"characters, got {len(key)}"
            )
        keys.append(key.encode("utf-8"))
    if not keys:
        raise KeyFileError(f"{source}: no grant key in the file")
    return keys


def read_keys(path: pathlib.Path) -> list[bytes]:
    """Reads a key file.

    Raises:
        KeyFileError: see ``parse_keys``, or the file is not UTF-8.
        OSError: it cannot be read.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise KeyFileError(f"{path}: not UTF-8 text: {e}") from e
    return parse_keys(text, str(path))


@functools.lru_cache(maxsize=16)
def _keyed(key: bytes) -> hmac.HMAC:
    """The HMAC of ``key`` over the domain tag, made once per key: each MAC copies it."""
    return hmac.new(key, _DOMAIN, _SHA256)


def _mac(key: bytes, signed_text: str) -> str:
    """The MAC of an id whose canonical text (``GrantRef.signed_text``) is ``signed_text``."""
    mac = _keyed(key).copy()
    mac.update(signed_text.encode("utf-8"))
    return base64.urlsafe_b64encode(mac.digest()[:MAC_BYTES]).decode("ascii").rstrip("=")


class GrantKeys:
    """Signs grant ids with the current key and verifies them with any loaded key."""

    def __init__(
        self, keys: Sequence[bytes], *, path: pathlib.Path | None = None, recheck_s: float = 1.0
    ) -> None:
        """Args:
        keys: current key first, then previous ones; at least one.
        path: the file ``keys`` were read from, followed for replacements.
        recheck_s: least time between two looks at the file (a stat), so that signing
            and verifying on the request path do not cost a system call each.

        Raises:
            KeyFileError: no key, or a key shorter than ``MIN_KEY_CHARS``.
        """
        if not keys:
            raise KeyFileError("no grant key given")
        for key in keys:
            if len(key) < MIN_KEY_CHARS:
                raise KeyFileError(f"a grant key must have at least {MIN_KEY_CHARS} bytes")
        self._keys = list(keys)
        self._file = None if path is None else _follow(path, recheck_s, keys=self._keys)

    @classmethod
    def from_file(cls, path: str | pathlib.Path, *, recheck_s: float = 1.0) -> GrantKeys:
        """Keys read from a key file that is followed from now on.

        Raises:
            KeyFileError, OSError: see ``read_keys``.
        """
        file = _follow(pathlib.Path(path), recheck_s)
        keys = cls(file.value)
        keys._file = file  # stamped before it was read: a replacement meanwhile is seen
        return keys

    @classmethod
    def generated(cls, state_dir: pathlib.Path) -> GrantKeys:
        """The key an embedded node keeps in its state directory, made on first use.

        Ids then survive restarts of the node. The file is created with mode 0600.

        Raises:
            KeyFileError, OSError: the file exists but is unusable, or cannot be made.
        """
        path = state_dir / GENERATED_KEY_FILE
        if not path.exists():
            state_dir.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".new")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, path)
            logger.info("generated a grant key in %s", path)
        return cls.from_file(path)

    def sign(self, ref: GrantRef) -> str:
        """The signed id of ``ref`` (its ``mac`` is ignored and replaced)."""
        text = ref.signed_text()
        return f"{text}.{_mac(self._current()[0], text)}"

    def verify(self, ref: GrantRef) -> bool:
        """True when ``ref`` carries a MAC made by one of the loaded keys."""
        if not ref.mac:
            return False
        given = ref.mac.encode("ascii", "replace")
        text = ref.signed_text()
        ok = False
        for key in self._current():
            # Every key is tried: the time taken does not tell which one matched.
            ok |= hmac.compare_digest(given, _mac(key, text).encode("ascii"))
        return ok

    def _current(self) -> list[bytes]:
        return self._keys if self._file is None else self._file()


def _follow(
    path: pathlib.Path, recheck_s: float, *, keys: list[bytes] | Unread = UNREAD
) -> Followed[list[bytes]]:
    """The key file at ``path``, followed: ``keys`` in force, or when not given, read now.

    Raises:
        KeyFileError, OSError: read now, and see ``read_keys``.
    """

    def reread(previous: list[bytes], keys: list[bytes]) -> None:
        if keys != previous:
            logger.info("grant keys re-read from %s: %d keys (the first signs)", path, len(keys))

    def kept(error: Exception) -> None:
        logger.warning("keeping the previous grant keys: %s", error)

    return Followed(
        [path],
        lambda: read_keys(path),
        keep_on=(OSError, KeyFileError),
        value=keys,
        recheck_s=recheck_s,
        on_read=reread,
        on_kept=kept,
    )


_EPHEMERAL: list[GrantKeys] = []


def ephemeral_keys() -> GrantKeys:
    """A random key shared by every node of this process, for tests and tools.

    Ids signed with it do not verify in another process or after a restart.
    """
    if not _EPHEMERAL:
        _EPHEMERAL.append(GrantKeys([secrets.token_urlsafe(32).encode("ascii")]))
    return _EPHEMERAL[0]
