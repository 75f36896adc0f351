"""fairshare.gateway.headers: what crosses each way, whatever the case of a name, and the
request id."""

from __future__ import annotations

import re

import pytest
from multidict import CIMultiDict

from fairshare.gateway.config import ConfigError, parse
from fairshare.gateway.headers import HeaderPolicy, request_id

POLICY = HeaderPolicy(deny=["X-Secret-Route"], consumed=("x-fairshare-team", None))


def test_the_client_headers_that_reach_the_upstream() -> None:
    sent = CIMultiDict(
        [
            ("Host", "gateway:8080"),
            ("Content-Length", "12"),
            ("Content-Type", "text/plain"),
            ("Accept-Encoding", "gzip"),
            ("Connection", "keep-alive, X-Hop"),
            ("X-Hop", "named by Connection"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Authorization", "Basic x"),
            ("TE", "trailers"),
            ("Upgrade", "h2c"),
            ("Authorization", "Bearer sk-1"),
            ("COOKIE", "a=b"),
            ("X-Api-Key", "sk-2"),
            ("X-Fairshare-Team", "team-a"),
            ("x-secret-route", "no"),
            ("X-Request-Id", "from-the-client"),
            ("traceparent", "00-1-2-01"),
            ("User-Agent", "AsyncOpenAI/Python"),
            ("Accept", "application/json"),
            ("X-Note", "one"),
            ("X-Note", "two"),
        ]
    )
    out = POLICY.to_upstream(sent, "the-id")
    assert list(out.items()) == [
        ("traceparent", "00-1-2-01"),
        ("User-Agent", "AsyncOpenAI/Python"),
        ("Accept", "application/json"),
        ("X-Note", "one"),
        ("X-Note", "two"),
        ("Content-Type", "application/json"),
        ("x-request-id", "the-id"),
    ]


def test_the_upstream_headers_that_reach_the_client() -> None:
    answered = CIMultiDict(
        [
            ("Content-Type", "application/json"),
            ("Content-Length", "99"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "X-Hop"),
            ("X-Hop", "named"),
            ("Date", "then"),
            ("Server", "uvicorn"),
            ("X-Fairshare-Priority", "-1000"),
            ("X-Secret-Route", "no"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
            ("x-request-id", "upstream's"),
        ]
    )
    out = POLICY.to_client(answered)
    assert list(out.items()) == [
        ("Content-Type", "application/json"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
        ("x-request-id", "upstream's"),  # the answer's own id is set after, by the hook
    ]


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("req-123_abc", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("a b", False),
        ("line\nbreak", False),
        ("é", False),
        ("", False),
        (None, False),
    ],
)
def test_the_clients_request_id_is_kept_when_it_can_be_logged(
    given: str | None, kept: bool
) -> None:
    headers = {} if given is None else {"x-request-id": given}
    made = request_id(headers)
    if kept:
        assert made == given
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", made)
        assert made != request_id(headers)  # a new one each time


def test_the_deny_list_is_read_as_header_names() -> None:
    base = {"allocator": {"endpoints": ["a:1"]}, "models": [{"name": "m", "pool": "p"}]}
    base["models"][0]["upstreams"] = ["http://u:1"]  # type: ignore[index]
    assert parse({**base, "headers": {"deny": ["X-Internal", "x-b"]}}).headers.deny == (
        "x-internal",
        "x-b",
    )
    assert parse(base).headers.deny == ()
    with pytest.raises(ConfigError, match=r"headers\.deny\[1\]"):
        parse({**base, "headers": {"deny": ["x-a", "bad name"]}})
    with pytest.raises(ConfigError, match=r"headers\.deny"):
        parse({**base, "headers": {"deny": "x-a"}})
    with pytest.raises(ConfigError, match=r"headers\.allow"):
        parse({**base, "headers": {"allow": ["x-a"]}})
