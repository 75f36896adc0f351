"""Which headers pass through the gateway, each way, and the request id.

To the upstream (``HeaderPolicy.to_upstream``): the client's end-to-end headers, so that
``x-request-id``, ``traceparent``/``tracestate``, ``user-agent``, ``openai-*`` and the
like reach vLLM, less:

- hop-by-hop headers (RFC 9110 §7.6.1): ``Connection`` and every header it names,
  ``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``, ``Transfer-Encoding``, ``Upgrade``; and
  ``Host`` and ``Content-Length``, which belong to the gateway's own request;
- what the gateway sets itself: ``Content-Type`` (the body is the JSON it sends),
  ``Accept-Encoding`` (the gateway reads the answer, so it asks for it uncompressed),
  ``Content-Encoding`` and ``Expect``;
- the client's credentials: ``Authorization``, ``Cookie``, ``X-Api-Key``, and the
  configured team and class headers (``auth.team_header``, ``auth.class_header``), which
  the gateway consumes;
- the names of ``headers.deny``;

and with ``x-request-id`` set to the request's id (``request_id``).

Back to the client (``HeaderPolicy.to_client``): the upstream's end-to-end headers, less
the hop-by-hop ones, ``Content-Length``, ``Date`` and ``Server`` (the gateway's answer has
its own), any ``x-fairshare-*`` (the gateway's own headers are set after, and an upstream
cannot forge them) and the names of ``headers.deny``. The caller then sets the
``x-fairshare-*`` headers and the answer's ``x-request-id``.

The request id (``request_id``): the client's ``x-request-id`` when it is 1 to
``MAX_REQUEST_ID_CHARS`` visible ASCII characters (no space, no control character), else
a new one (32 hex digits, random), so a log line and a header never carry what a client
could use to forge lines.

Guaranteed: no header named above as dropped crosses, whatever its case; a header sent
several times (``Set-Cookie``) crosses with each value. Not guaranteed: that the upstream
honours what it receives (vLLM reads ``x-request-id`` only with
``--enable-request-id-headers``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from typing import Final

from multidict import CIMultiDict

REQUEST_ID: Final = "x-request-id"
MAX_REQUEST_ID_CHARS: Final = 128
GATEWAY_PREFIX: Final = "x-fairshare-"
"""The gateway's own answer headers (``fairshare.gateway.proxy.grant_headers``)."""

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Headers of one connection, never passed on either way (``Proxy-*`` too, by prefix)."""
SET_BY_GATEWAY: Final = frozenset(
    {"content-type", "accept-encoding", "content-encoding", "expect", REQUEST_ID}
)
"""Request headers the gateway writes itself on the upstream request."""
CREDENTIALS: Final = frozenset({"authorization", "cookie", "x-api-key"})
"""The client's credentials: for the gateway, never for the upstream."""
OWN_ANSWER: Final = frozenset({"date", "server"})
"""Answer headers the gateway's own answer carries (its aiohttp server sets them)."""


def _visible(text: str) -> bool:
    return all("!" <= c <= "~" for c in text)


def request_id(headers: Mapping[str, str]) -> str:
    """The request's id: the client's ``x-request-id`` when usable, else a new one."""
    given = headers.get(REQUEST_ID)
    if given and len(given) <= MAX_REQUEST_ID_CHARS and _visible(given):
        return given
    return secrets.token_hex(16)


def _named_by_connection(headers: Mapping[str, str]) -> set[str]:
    """The headers the ``Connection`` header names (hop-by-hop for this connection)."""
    named: set[str] = set()
    for name, value in headers.items():
        if name.lower() == "connection":
            named.update(token.strip().lower() for token in value.split(","))
    return named


def _passes(name: str, dropped: frozenset[str], named: set[str]) -> bool:
    lower = name.lower()
    return lower not in dropped and lower not in named and not lower.startswith("proxy-")


class HeaderPolicy:
    """What crosses each way (see the module doc), for one configuration."""

    def __init__(self, *, deny: Iterable[str] = (), consumed: Iterable[str | None] = ()) -> None:
        """``deny``: ``headers.deny``; ``consumed``: the request headers the gateway reads
        for itself (the team and class headers; None where not configured)."""
        denied = frozenset(name.lower() for name in deny)
        mine = frozenset(name.lower() for name in consumed if name)
        self._request_dropped = HOP_BY_HOP | SET_BY_GATEWAY | CREDENTIALS | mine | denied
        self._answer_dropped = HOP_BY_HOP | OWN_ANSWER | denied

    def to_upstream(self, headers: Mapping[str, str], request_id: str) -> CIMultiDict[str]:
        """The headers of the upstream request: the client's that pass, the JSON content
        type and ``x-request-id``."""
        named = _named_by_connection(headers)
        out: CIMultiDict[str] = CIMultiDict(
            (k, v) for k, v in headers.items() if _passes(k, self._request_dropped, named)
        )
        out["Content-Type"] = "application/json"
        out[REQUEST_ID] = request_id
        return out

    def to_client(self, headers: Mapping[str, str]) -> CIMultiDict[str]:
        """The upstream answer's headers that go back to the client (without the
        gateway's own, which the caller adds)."""
        named = _named_by_connection(headers)
        return CIMultiDict(
            (k, v)
            for k, v in headers.items()
            if _passes(k, self._answer_dropped, named) and not k.lower().startswith(GATEWAY_PREFIX)
        )
