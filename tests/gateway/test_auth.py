"""Who a request is for, end to end: API keys (plain and hashed), the trusted team header
and the Gateway API Inference Extension's fairness id, and what is refused (401) without
serving anything; with the real ``openai`` SDK as the client, the stand-in vLLM upstream,
``fairshare gateway`` and an allocator, each its own process. The team a request was
charged to is read from the allocator."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import openai
import pytest
import yaml
from grpc import aio

from fairshare.gateway.identity import FAIRNESS_ID_HEADER, NO_IDENTITY
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.gateway import Gateway, run_gateway_command, wait_gateway
from harness.standin import Standin

from .conftest import MODEL, TEAM_HEADER, Stack, eventually, gateway_config, start_stack

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "one two"}]
POOL = "gpu-a"
CLASS_HEADER = "x-fairshare-class"


def models(s: dict[str, Standin]) -> list[dict[str, object]]:
    return [{"name": MODEL, "pool": POOL, "upstreams": [s["a"].url]}]


def hash_key(key: str) -> str:
    """The keys-file entry ``fairshare gateway hash-key`` prints for ``key``."""
    done = run_gateway_command("hash-key", stdin=key + "\n")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def charged(stack: Stack) -> dict[str, float]:
    """The allocator's usage of the pool by team: whom the gateway's releases charged."""
    async with aio.insecure_channel(stack.allocator.address) as channel:
        snapshot = await pb_grpc.AllocatorStub(channel).Snapshot(
            pb.SnapshotRequest(pool=POOL), timeout=5
        )
    return {t.team: t.usage for t in snapshot.teams if t.usage > 0}


async def ask(client: openai.AsyncOpenAI) -> str:
    """One chat completion; the priority it was sent with."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=2
    )
    raw.parse()
    return raw.headers["x-fairshare-priority"]


async def refused(client: openai.AsyncOpenAI) -> str:
    """The message of the 401 that a chat completion and the model list are answered (the
    error object's, as the gateway wrote it)."""
    with pytest.raises(openai.AuthenticationError) as listing:
        await client.models.list()
    with pytest.raises(openai.AuthenticationError) as raised:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert raised.value.status_code == 401
    assert raised.value.code == "invalid_api_key"
    assert listing.value.body == raised.value.body
    assert isinstance(raised.value.body, dict)
    return str(raised.value.body["message"])


async def test_keys_decide_and_the_team_header_serves_only_requests_without_one(
    tmp_path: Path,
) -> None:
    key_a = "sk-" + secrets.token_hex(16)
    key_b = "sk-" + secrets.token_hex(16)
    hashed_b = hash_key(key_b)
    assert hashed_b.startswith("sha256:") and key_b not in hashed_b
    keys = tmp_path / "keys.yaml"
    listed = {key_a: {"team": "team-a"}, hashed_b: {"team": "team-b", "class": "batch"}}
    keys.write_text(yaml.safe_dump({"keys": listed}))
    auth = {"keys_file": str(keys), "team_header": TEAM_HEADER, "class_header": CLASS_HEADER}
    async with start_stack(
        tmp_path,
        auth=auth,
        pools={POOL: {"capacity": 4}},
        standins={"a": {}},
        models=models,
    ) as stack:
        # A presented key that is not listed is refused, the team header notwithstanding.
        for wrong in ("sk-WRONG", key_a[:-1], hashed_b):
            message = await refused(stack.client("team-a", key=wrong))
            assert "sk-" not in message and hashed_b not in message
        assert await stack.records("a") == []
        assert await charged(stack) == {}
        # The hashed key names its team and class, over the headers.
        keyed_b = stack.client("team-a", key=key_b, **{CLASS_HEADER: "interactive"})
        assert await ask(keyed_b) == "1"  # within share, batch
        await eventually(lambda: _charged_only(stack, {"team-b"}))
        # Without a key, the team header (from a trusted peer: loopback by default).
        assert await ask(stack.client("team-a", **{CLASS_HEADER: "batch"})) == "1"
        await eventually(lambda: _charged_only(stack, {"team-a", "team-b"}))
        # The plain key, over the header.
        assert await ask(stack.client("team-x", key=key_a)) == "0"
        assert "team-x" not in await charged(stack)
        assert len(await stack.records("a")) == 3

        # A broken replacement of the keys file leaves the keys in force; the log names the
        # line, not the key.
        keys.write_text(f'keys:\n  "{key_a}": {{team: team-a}}\n  "{key_b}": {{team: [b]}}\n')
        log = stack.gateway.log_path

        async def kept() -> bool:
            assert await ask(stack.client(None, key=key_b)) == "1"
            return "keeping the previous API keys" in log.read_text()

        await eventually(kept)
        text = log.read_text()
        assert "line 3" in text
        assert key_a[:8] not in text and key_b[:8] not in text

        # A gateway that trusts headers from other peers only: the same headers are refused
        # from loopback (the fairness id as the team header), a key still serves.
        keys.write_text(yaml.safe_dump({"keys": listed}))
        untrusting = {**auth, "fairness_id": True, "trusted_peers": ["192.0.2.0/24"]}
        async with other_gateway(stack, "gw-untrusting", untrusting) as url:
            assert "trusted_peers" in await refused(
                stack.client("team-a").with_options(base_url=url)
            )
            fairness = stack.client(None, **{FAIRNESS_ID_HEADER: "team-a"})
            assert "trusted_peers" in await refused(fairness.with_options(base_url=url))
            assert await ask(stack.client(None, key=key_a).with_options(base_url=url)) == "0"


async def _charged_only(stack: Stack, teams: set[str]) -> bool:
    return set(await charged(stack)) == teams


@asynccontextmanager
async def other_gateway(stack: Stack, name: str, auth: dict[str, object]) -> AsyncIterator[str]:
    """A second gateway, ``name`` (its holder too), on the stack's allocator and stand-in,
    with ``auth``: its base URL for the SDK."""
    config = gateway_config(stack.allocator, models(stack.standins), auth=auth)
    config["allocator"] = {**config["allocator"], "holder": name}  # type: ignore[dict-item]
    gateway = Gateway(stack.workdir, config, name=name)
    gateway.start()
    try:
        await wait_gateway(gateway)
        yield gateway.url + "/v1"
    finally:
        gateway.stop(timeout_s=15)


async def test_the_inference_extension_fairness_id_names_the_team_where_configured(
    tmp_path: Path,
) -> None:
    """``x-gateway-inference-fairness-id``, as the Gateway API Inference Extension's
    endpoint picker reads it: off by default; on, a team source like the team header
    (second to it, for a request without a key, from a trusted peer)."""
    key_a = "sk-" + secrets.token_hex(16)
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": {key_a: {"team": "team-a"}}}))
    async with start_stack(
        tmp_path, pools={POOL: {"capacity": 4}}, standins={"a": {}}, models=models
    ) as stack:
        only_fairness = stack.client(None, **{FAIRNESS_ID_HEADER: "team-b"})
        assert await refused(only_fairness) == NO_IDENTITY  # off by default
        auth = {"keys_file": str(keys), "team_header": TEAM_HEADER, "fairness_id": True}
        async with other_gateway(stack, "gw-fairness", auth) as url:
            assert await ask(only_fairness.with_options(base_url=url)) == "0"
            await eventually(lambda: _charged_only(stack, {"team-b"}))
            # The team header first.
            both = stack.client("team-a", **{FAIRNESS_ID_HEADER: "team-c"})
            assert await ask(both.with_options(base_url=url)) == "0"
            await eventually(lambda: _charged_only(stack, {"team-a", "team-b"}))
            # A key decides alone: an unknown one is refused, a known one names its team.
            wrong = stack.client(None, key="sk-WRONG", **{FAIRNESS_ID_HEADER: "team-c"})
            assert await refused(wrong.with_options(base_url=url)) == "the API key is not valid"
            keyed = stack.client(None, key=key_a, **{FAIRNESS_ID_HEADER: "team-c"})
            assert await ask(keyed.with_options(base_url=url)) == "0"
            assert "team-c" not in await charged(stack)


def test_a_bad_keys_file_stops_the_start_naming_the_line_not_the_key(tmp_path: Path) -> None:
    key = "sk-" + secrets.token_hex(16)
    keys = tmp_path / "keys.yaml"
    keys.write_text(f'keys:\n  "sk-fine": {{team: a}}\n  "{key}": {{team: a, class: urgent}}\n')
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "allocator": {"endpoints": ["127.0.0.1:1"]},
                "auth": {"keys_file": str(keys)},
                "models": [{"name": MODEL, "pool": POOL, "upstreams": ["http://127.0.0.1:1"]}],
            }
        )
    )
    done = run_gateway_command("--config", str(config))
    assert done.returncode == 2
    assert f"{keys} line 3: class must be one of" in done.stderr
    assert key[:6] not in done.stderr.replace("sk-fine", "")
