"""The access log: one structured line per request of the API port.

Each request served (the probes ``/healthz`` and ``/readyz`` aside) has an ``Entry`` that
the middleware (``fairshare.gateway.middleware``) opens when it arrives and writes when it
ends, and that the request path fills in as it learns: who (team, class), what (model),
where (pool, upstream), the decision (priority, standing), the answer (status, time to
its first byte, duration), the tokens and the charge, and why it ended (``ENDINGS``).

The line goes to the logger ``fairshare.gateway.access`` at ``access_log.level`` (INFO by
default), as one JSON object (``access_log.format: json``, the default) or as
``key=value`` pairs (``logfmt``). Fields (``Entry.fields``), in this order: ``time`` (UTC,
ISO 8601 with milliseconds), ``request_id``, ``method``, ``path``, ``team``, ``class``,
``model``, ``pool``, ``upstream``, ``priority``, ``standing``, ``status``, ``ttfb_s``,
``duration_s``, ``prompt_tokens``, ``completion_tokens``, ``charged``, ``ended``. A field
not known for a request (no team: refused before; no status line: the client went first)
is ``null`` in JSON and left out in logfmt.

Guaranteed: no line carries key material (never a header's value but the request id the
gateway checked, ``fairshare.gateway.headers.request_id``) or a grant id; at most one line
per request. Not guaranteed: a line for a request cut by the process's death.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from fairshare.gateway.config import AccessLogSettings

LOGGER: Final = "fairshare.gateway.access"
ENDINGS: Final = (
    "done",
    "refused",
    "client_gone",
    "upstream_error",
    "timeout",
    "shutdown",
    "error",
)
"""Why a request ended: answered (whatever the status an upstream gave, below 500);
refused by the gateway or the allocator before any upstream; the client went away; the
upstream failed (no connection, broken before or during the answer, or a 5xx answer); it
timed out at the upstream; the gateway stopped (cut after its grace); the gateway failed
(a bug: 500)."""
MILLI: Final = 3
"""Decimals of the seconds fields."""


@dataclass
class Entry:
    """What is known of one request (see the module doc); monotonic times."""

    request_id: str
    method: str
    path: str
    arrived: float
    team: str | None = None
    service_class: str | None = None
    model: str | None = None
    pool: str | None = None
    upstream: str | None = None
    priority: int | None = None
    standing: str | None = None
    status: int | None = None
    first_byte: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    charged: float | None = None
    ended: str = "done"

    def fields(self, ended_at: float, wall: float) -> dict[str, object]:
        """The line's fields, in order, for a request that ended at ``ended_at``
        (monotonic), ``wall`` being then on the wall clock."""
        ttfb = None if self.first_byte is None else round(self.first_byte - self.arrived, MILLI)
        return {
            "time": datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds"),
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "team": self.team,
            "class": self.service_class,
            "model": self.model,
            "pool": self.pool,
            "upstream": self.upstream,
            "priority": self.priority,
            "standing": self.standing,
            "status": self.status,
            "ttfb_s": ttfb,
            "duration_s": round(ended_at - self.arrived, MILLI),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "charged": None if self.charged is None else round(self.charged, MILLI),
            "ended": self.ended,
        }


def logfmt(fields: dict[str, object]) -> str:
    """``key=value`` pairs; a value with a space, a quote, ``=`` or nothing is quoted as a
    JSON string; unknown values are left out."""
    pairs = []
    for key, value in fields.items():
        if value is None:
            continue
        text = str(value)
        if not text or any(c in text for c in ' "=\\') or not text.isprintable():
            text = json.dumps(text)
        pairs.append(f"{key}={text}")
    return " ".join(pairs)


class AccessLog:
    """Writes entries as configured (``access_log``)."""

    def __init__(self, settings: AccessLogSettings, logger: logging.Logger | None = None) -> None:
        self.settings = settings
        self.logger = logger or logging.getLogger(LOGGER)
        self._level = logging.getLevelName(settings.level)

    def write(self, entry: Entry) -> None:
        """Logs ``entry`` as ended now (nothing when the log is off)."""
        if not self.settings.enabled or not self.logger.isEnabledFor(self._level):
            return
        fields = entry.fields(time.monotonic(), time.time())
        if self.settings.format == "json":
            line = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
        else:
            line = logfmt(fields)
        self.logger.log(self._level, "%s", line)
