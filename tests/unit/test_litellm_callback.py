"""fairshare.integrations.litellm without LiteLLM: its settings, the team and class of a
request, what goes into the body, and one release per request whatever way it ends (the
hooks as LiteLLM's proxy calls them are in tests/litellm)."""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fairshare import Class
from fairshare.client import AllocatorClient, ClientGrant
from fairshare.cost import CostSettings
from fairshare.integrations.litellm import (
    RELEASE_AFTER_ANSWER_S,
    Fairshare,
    Refused,
    class_of,
    team_of,
)
from fairshare.integrations.litellm_config import (
    ConfigError,
    Settings,
    TeamSettings,
    load,
    parse,
)

pytestmark = pytest.mark.timeout(10)

MINIMAL = {"allocator": {"endpoints": ["127.0.0.1:50051"]}}


@pytest.mark.parametrize(
    ("document", "key"),
    [
        pytest.param({}, "allocator:", id="no-allocator"),
        pytest.param({"allocator": {"endpoints": []}}, "allocator.endpoints", id="no-endpoints"),
        pytest.param(
            {"allocator": {"endpoints": ["nohost"]}}, "allocator.endpoints[0]", id="bad-endpoint"
        ),
        pytest.param({**MINIMAL, "team": {"from": ["group"]}}, "team.from[0]", id="bad-source"),
        pytest.param({**MINIMAL, "class": {"default": "urgent"}}, "class.default", id="class"),
        pytest.param({**MINIMAL, "cost": {"unit": "gpus"}}, "cost.unit", id="unit"),
        pytest.param({**MINIMAL, "cost": {"prompt_weight": -1}}, "cost.prompt_weight", id="w"),
        pytest.param({**MINIMAL, "pools": {"m": 3}}, "pools.m", id="pool"),
        pytest.param({**MINIMAL, "colour": 1}, "(top).colour", id="unknown-key"),
        pytest.param({**MINIMAL, "headers": "yes"}, "headers", id="headers"),
        pytest.param({**MINIMAL, "borrow_wait_s": -1}, "borrow_wait_s", id="wait"),
    ],
)
def test_a_wrong_setting_is_named(document: object, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse(document)


def test_the_settings_file_is_named_by_the_environment(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="FAIRSHARE_LITELLM_CONFIG"):
        load({})
    path = tmp_path / "fairshare.yaml"
    path.write_text("allocator: {endpoints: ['a:1']}\npools: {m: gpu-a}\ncost: {unit: seconds}\n")
    settings = load({"FAIRSHARE_LITELLM_CONFIG": str(path)})
    assert settings.pool_of("m") == "gpu-a" and settings.pool_of("other") is None
    assert settings.cost == CostSettings(unit="seconds")
    assert settings.team == TeamSettings()


KEY = {"team_alias": None, "team_id": "t-1", "key_alias": "bot", "metadata": {}}
HEADERS = {"proxy_server_request": {"headers": {"X-Fairshare-Team": "h"}}}


@pytest.mark.parametrize(
    ("sources", "key", "data", "team"),
    [
        pytest.param(("team_alias", "team_id"), KEY, {}, "t-1", id="id-after-no-alias"),
        pytest.param(("key_alias",), KEY, {}, "bot", id="key-alias"),
        pytest.param(("header", "team_id"), KEY, HEADERS, "h", id="header-first"),
        pytest.param(("metadata",), {}, {"metadata": {"fairshare_team": "m"}}, "m", id="meta"),
        pytest.param(("header",), {}, {}, None, id="none"),
    ],
)
def test_the_team_is_the_first_source_that_names_one(
    sources: tuple[str, ...], key: object, data: dict[str, Any], team: str | None
) -> None:
    assert team_of(key, data, TeamSettings(sources=sources)) == team


def test_the_class_is_the_requests_then_the_keys() -> None:
    key = {"metadata": {"fairshare_class": "batch"}}
    assert class_of(key, {}, "fairshare_class", Class.INTERACTIVE) is Class.BATCH
    data = {"metadata": {"fairshare_class": "Interactive"}}
    assert class_of(key, data, "fairshare_class", Class.BATCH) is Class.INTERACTIVE
    with pytest.raises(Refused, match="fairshare_class"):
        class_of({}, {"metadata": {"fairshare_class": "x"}}, "fairshare_class", Class.BATCH)


class FakeGrant(ClientGrant):
    async def release(self, consumed: float = 0.0) -> None:
        self.releases.append(consumed)

    releases: list[float]


class FakeClient:
    def __init__(self) -> None:
        self.grants: list[FakeGrant] = []
        self.waits: list[float] = []

    async def acquire(
        self, pool: str, team: str, service_class: Class, est_tokens: int, *, wait_s: float = 0.0
    ) -> ClientGrant:
        self.waits.append(wait_s)
        grant = FakeGrant(
            pool, team, service_class, est_tokens, "id", 12, True, False, False, "", 1
        )
        grant.releases = []
        self.grants.append(grant)
        return grant


def _fairshare() -> tuple[Fairshare, FakeClient]:
    fake = FakeClient()
    settings = Settings(allocator=parse(MINIMAL).allocator, pools={"m": "gpu-a"})
    return Fairshare(settings, client=lambda: fake), fake  # type: ignore[return-value,arg-type]


def _request(call_id: str = "c1", **more: object) -> dict[str, Any]:
    return {
        "litellm_call_id": call_id,
        "model": "m",
        "messages": [{"role": "user", "content": "x" * 40}],
        "max_tokens": 6,
        "priority": 0,
        "metadata": {"fairshare_team": "a"},
        **more,
    }


async def test_the_priority_goes_into_extra_body_and_the_headers_into_metadata() -> None:
    fairshare, fake = _fairshare()
    data = _request(stream=True, extra_body={"top_k": 3})
    fairshare.settings = Settings(
        allocator=fairshare.settings.allocator,
        pools={"m": "gpu-a"},
        team=TeamSettings(sources=("metadata",)),
    )
    await fairshare.before({}, data, "acompletion")
    assert data["extra_body"] == {"top_k": 3, "priority": 12}
    assert "priority" not in data
    assert data["stream_options"] == {"include_usage": True}
    assert fake.grants[0].est_tokens == 10 + 4 + 6
    assert fairshare.headers(data) == {
        "x-fairshare-priority": "12",
        "x-fairshare-standing": "borrowing",
        "x-fairshare-borrowing": "true",
        "x-fairshare-degraded": "false",
        "x-fairshare-pool": "gpu-a",
    }
    other = _request("c2", model="unmapped")
    await fairshare.before({}, other, "acompletion")
    assert "extra_body" not in other and fairshare.in_flight == 1
    # A borrower past a lending limit may be held, as long as the gateway holds one.
    assert fake.waits == [60.0]
    assert parse({**MINIMAL, "borrow_wait_s": 0}).borrow_wait_s == 0.0


async def test_no_team_is_refused() -> None:
    fairshare, _ = _fairshare()
    with pytest.raises(Refused) as refused:
        await fairshare.before({}, _request(), "acompletion")
    assert refused.value.status == 401


async def _settled() -> None:
    await asyncio.sleep(RELEASE_AFTER_ANSWER_S * 2)  # a whole answer's release is due then
    for _ in range(3):
        await asyncio.sleep(0)


async def _held(fairshare: Fairshare, call_id: str) -> dict[str, Any]:
    fairshare.settings = Settings(
        allocator=fairshare.settings.allocator,
        pools={"m": "gpu-a"},
        team=TeamSettings(sources=("metadata",)),
    )
    data = _request(call_id)
    await fairshare.before({}, data, "acompletion")
    return data


async def test_each_path_releases_once_with_its_charge() -> None:
    fairshare, fake = _fairshare()
    done = await _held(fairshare, "ok")
    fairshare.succeeded(done, {"usage": {"prompt_tokens": 7, "completion_tokens": 2}})
    fairshare.logged(done, None, success=False)  # the backstop finds it released
    await asyncio.sleep(0)
    # Released once LiteLLM has sent the answer; counted in flight until then.
    assert fake.grants[0].releases == [] and fairshare.in_flight == 1
    error = await _held(fairshare, "500")
    fairshare.failed(error, RuntimeError("status 500"))
    cut = await _held(fairshare, "cut")
    fairshare.failed(cut, type("Timeout", (Exception,), {})())
    await _settled()
    assert [g.releases for g in fake.grants] == [[9.0], [0.0], [14.0]]
    assert fairshare.in_flight == 0


async def test_a_stream_releases_at_its_end_however_it_ends() -> None:
    fairshare, fake = _fairshare()

    async def chunks(n: int) -> AsyncIterator[dict[str, Any]]:
        for _ in range(n):
            yield {"choices": [{"delta": {"content": "t"}}]}
        yield {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}

    whole = await _held(fairshare, "whole")
    seen = [c async for c in fairshare.stream(chunks(3), whole)]
    assert len(seen) == 3, "the usage chunk the client did not ask for is dropped"
    fairshare.failed(whole, RuntimeError("late"))  # already released
    gone = await _held(fairshare, "gone")
    stream = fairshare.stream(chunks(100), gone)
    await anext(stream)
    await anext(stream)
    await stream.aclose()  # the client went away
    await _settled()
    assert [g.releases for g in fake.grants] == [[8.0], [10.0 + 4 + 2]]
    assert fairshare.in_flight == 0


def test_the_module_imports_without_litellm() -> None:
    import fairshare.integrations.litellm as module

    with pytest.raises(AttributeError):
        _ = module.no_such_name
    assert isinstance(AllocatorClient, type)


def _hooks(path: Path) -> set[str]:
    """The hooks (``async def``) of the handler class a callback module defines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    handler = next(c for c in classes if any(ast.unparse(b) == "CustomLogger" for b in c.bases))
    return {f.name for f in handler.body if isinstance(f, ast.AsyncFunctionDef)}


def test_the_benchmarks_do_nothing_callback_has_the_same_hooks() -> None:
    """bench/litellm_noop.py is the floor of what the callback adds to LiteLLM's proxy:
    LiteLLM's cost depends on which hooks a callback has, so it must have the same."""
    root = Path(__file__).resolve().parents[2]
    ours = _hooks(root / "fairshare" / "integrations" / "litellm.py")
    assert "async_pre_call_hook" in ours
    assert _hooks(root / "bench" / "litellm_noop.py") == ours
