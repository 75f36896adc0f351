"""fairshare.gateway.accesslog: the line's fields and formats, and its settings."""

from __future__ import annotations

import json
import logging

import pytest

from fairshare.gateway.accesslog import LOGGER, AccessLog, Entry, logfmt
from fairshare.gateway.config import AccessLogSettings, ConfigError, parse

BASE = {
    "allocator": {"endpoints": ["a:1"]},
    "models": [{"name": "m", "pool": "p", "upstreams": ["http://u:1"]}],
}


def entry() -> Entry:
    return Entry("rid-1", "POST", "/v1/chat/completions", arrived=100.0, team="team a")


def test_the_fields_in_order_with_unknowns_as_null() -> None:
    fields = Entry(
        "rid-1",
        "POST",
        "/v1/completions",
        arrived=100.0,
        status=200,
        first_byte=100.25,
        charged=1 / 3,
    ).fields(ended_at=101.5, wall=0.0)
    assert list(fields) == [
        "time",
        "request_id",
        "method",
        "path",
        "team",
        "class",
        "model",
        "pool",
        "upstream",
        "priority",
        "standing",
        "status",
        "ttfb_s",
        "duration_s",
        "prompt_tokens",
        "completion_tokens",
        "charged",
        "ended",
    ]
    assert fields["time"] == "1970-01-01T00:00:00.000+00:00"
    assert (fields["ttfb_s"], fields["duration_s"], fields["charged"]) == (0.25, 1.5, 0.333)
    assert fields["team"] is None and fields["ended"] == "done"


def test_logfmt_quotes_what_would_split_a_pair_and_leaves_out_unknowns() -> None:
    line = logfmt({"a": "plain", "b": "two words", "c": None, "d": 'q"uote', "e": "x=y", "f": 3})
    assert line == 'a=plain b="two words" d="q\\"uote" e="x=y" f=3'
    assert logfmt({"a": "line\nbreak", "b": ""}) == 'a="line\\nbreak" b=""'


@pytest.mark.parametrize("form", ["json", "logfmt"])
def test_a_line_on_the_access_logger(form: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    AccessLog(AccessLogSettings(format=form)).write(entry())
    [record] = caplog.records
    assert (record.name, record.levelno) == (LOGGER, logging.INFO)
    text = record.getMessage()
    if form == "json":
        assert json.loads(text)["team"] == "team a"
    else:
        assert 'team="team a"' in text and "pool=" not in text


def test_off_or_below_the_loggers_level_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    AccessLog(AccessLogSettings(enabled=False)).write(entry())
    AccessLog(AccessLogSettings(level="DEBUG")).write(entry())
    assert caplog.records == []


def test_the_settings() -> None:
    assert parse(BASE).access_log == AccessLogSettings(enabled=True, format="json", level="INFO")
    settings = parse(
        {**BASE, "access_log": {"enabled": False, "format": "logfmt", "level": "debug"}}
    )
    assert settings.access_log == AccessLogSettings(False, "logfmt", "DEBUG")
    for wrong, key in [
        ({"enabled": "yes"}, "access_log.enabled"),
        ({"format": "xml"}, "access_log.format"),
        ({"level": "TRACE"}, "access_log.level"),
        ({"file": "x"}, "access_log.file"),
    ]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            parse({**BASE, "access_log": wrong})
