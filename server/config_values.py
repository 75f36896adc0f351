"""Checked readers of raw configuration values, one per kind of value.

Each takes the dotted path of the value (``tls.cert_file``, ``pools[0].name``) and the
value as YAML, the environment or a flag gave it, and returns it in its type or raises
``ConfigError`` whose ``path`` is that path. They do not know which setting they read:
defaults and the rules between settings belong to ``server.config``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from enum import Enum
from typing import TypeVar

from ha import ConfigError

E = TypeVar("E", bound=Enum)

MAX_PORT = 65535
"""The highest TCP port number (port 0 asks the system for a free one)."""


def read_mapping(path: str, value: object, allowed: Sequence[str]) -> dict[str, object]:
    """A mapping whose keys are all in ``allowed``; None reads as empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be a mapping, got {value!r}")
    for key in value:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(where, f"unknown key (known: {', '.join(allowed)})")
    return value


def read_choice(path: str, value: object, kind: type[E]) -> E:
    """One of the values of the enum ``kind`` (its ``value`` as written)."""
    try:
        return kind(value)
    except ValueError:
        choices = " or ".join(str(member.value) for member in kind)
        raise ConfigError(path, f"must be {choices}, got {value!r}") from None


def read_string(path: str, value: object, *, empty: bool = False) -> str:
    """A string, non-empty unless ``empty``."""
    if not isinstance(value, str):
        raise ConfigError(path, f"must be a string, got {value!r}")
    if not empty and not value:
        raise ConfigError(path, "must not be empty")
    return value


def read_opt_file(path: str, value: object) -> str | None:
    """The path of an existing file; None or empty reads as None."""
    if value is None or value == "":
        return None
    text = read_string(path, value)
    if not os.path.isfile(text):
        raise ConfigError(path, f"no such file: {text}")
    return text


def read_strings(path: str, value: object) -> tuple[str, ...]:
    """A list of non-empty strings, or one comma-separated string; None reads as empty."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [item.strip() for item in value.split(",") if item.strip()]
    if not isinstance(value, list | tuple):
        raise ConfigError(path, f"must be a list of strings, got {value!r}")
    return tuple(read_string(f"{path}[{i}]", item) for i, item in enumerate(value))


def read_number(path: str, value: object) -> float:
    """A finite int or float (not a bool), as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(path, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(path, f"must be finite, got {value!r}")
    return float(value)


def check_address(path: str, value: object) -> str:
    """Checks a ``host:port`` address (IPv6 hosts in brackets); returns it.

    Raises:
        ConfigError: not ``host:port`` with a port in 0..65535.
    """
    text = read_string(path, value)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= MAX_PORT:
        raise ConfigError(path, f"must be host:port, got {text!r}")
    return text
