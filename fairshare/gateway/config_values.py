"""The checked readers of the gateway's configuration values, and its one error.

Each reader takes the key (a dotted path such as ``models[1].upstreams[0]``) and the raw
value from the YAML file, and returns the value checked, or raises ``ConfigError`` whose
message names the key and says what is wrong. ``fairshare.gateway.config`` reads every
section with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlsplit

from fairshare.routing import ROUTERS

MAX_PORT: Final = 65535


class ConfigError(ValueError):
    """The file cannot be used; the message names the key."""


def mapping(key: str, value: object, allowed: Sequence[str]) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        where = f"{key}." if key else ""
        raise ConfigError(f"{where}{unknown[0]}: unknown key (known: {', '.join(allowed)})")
    return value


def string(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value.strip()


def opt_string(key: str, value: object) -> str | None:
    return None if value is None or value == "" else string(key, value)


def strings(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: expected a non-empty list of strings, got {value!r}")
    return tuple(string(f"{key}[{i}]", v) for i, v in enumerate(value))


def number(key: str, value: object, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{key}: must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def integer(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: expected an integer >= 1, got {value!r}")
    return value


def check_address(key: str, value: object) -> str:
    """``host:port`` with a port in 1..65535."""
    text = string(key, value)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        raise ConfigError(f"{key}: expected host:port, got {text!r}")
    return text


def upstream_url(key: str, value: object) -> str:
    url = string(key, value).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: expected an http(s):// base URL, got {url!r}")
    if parts.path.endswith("/v1"):
        raise ConfigError(f"{key}: give the server's base URL without /v1, got {url!r}")
    return url


def routing(key: str, value: object) -> str:
    if value not in ROUTERS:
        raise ConfigError(f"{key}: expected one of {', '.join(ROUTERS)}, got {value!r}")
    return str(value)
