"""The access log of a real gateway process: one JSON line per request, with who, what,
where, the decision, the answer and why it ended, for each way a request can end; no key
material, no probes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from harness.net import free_port
from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(90)

MESSAGES = [{"role": "user", "content": "one two"}]
PREFIX = "fairshare.gateway.access: "
SECRET = "sk-never-logged-7f3a"


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    dead = f"http://127.0.0.1:{free_port()}"

    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [
            {"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]},
            {"name": "dead", "pool": "gpu-a", "upstreams": [dead]},
        ]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 4}},
        standins={"a": {"models": (MODEL, "dead"), "tokens_per_s": 500.0}},
        models=models,
        limits={"upstream_first_byte_s": 1.0, "upstream_idle_s": 1.0},
        ready_path="/healthz",  # the dead upstream keeps /readyz at 503
    ) as running:
        yield running


def lines(stack: Stack) -> dict[str, dict[str, object]]:
    """The access log lines so far, by request id."""
    found = {}
    for line in stack.gateway.log_text().splitlines():
        if PREFIX in line:
            fields = json.loads(line.split(PREFIX, 1)[1])
            found[str(fields["request_id"])] = fields
    return found


def ask(request_id: str) -> dict[str, object]:
    return {"extra_headers": {"x-request-id": request_id}}


async def test_one_line_per_request_says_how_it_ended(stack: Stack) -> None:
    client = stack.client("team-a").with_options(api_key=SECRET)
    await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, **ask("done")
    )
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2000, stream=True, **ask("gone")
    )
    async for _ in stream:
        break
    await stream.close()
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"standin_status": 500}, **ask("5xx")
        )
    with pytest.raises(openai.APIStatusError):
        await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"standin_hang": True}, **ask("slow")
        )
    with pytest.raises(openai.APIStatusError):
        await client.chat.completions.create(model="dead", messages=MESSAGES, **ask("dead"))
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=MESSAGES, **ask("nope"))
    with pytest.raises(openai.AuthenticationError):
        await stack.client(team=None).chat.completions.create(
            model=MODEL, messages=MESSAGES, **ask("anon")
        )
    await eventually(lambda: len(lines(stack)) == 7)
    seen = lines(stack)
    done = seen["done"]
    assert done == {
        "time": done["time"],
        "request_id": "done",
        "method": "POST",
        "path": "/v1/chat/completions",
        "team": "team-a",
        "class": "interactive",
        "model": MODEL,
        "pool": "gpu-a",
        "upstream": stack.standins["a"].url,
        "priority": 0,
        "standing": "within",
        "status": 200,
        "ttfb_s": done["ttfb_s"],
        "duration_s": done["duration_s"],
        "prompt_tokens": 2,  # the stand-in's usage: words
        "completion_tokens": 3,
        "charged": 5.0,
        "ended": "done",
    }
    assert 0 < float(done["ttfb_s"]) <= float(done["duration_s"])  # type: ignore[arg-type]
    ended = {rid: (f["status"], f["ended"]) for rid, f in seen.items()}
    assert ended == {
        "done": (200, "done"),
        "gone": (200, "client_gone"),
        "5xx": (500, "upstream_error"),
        "slow": (504, "timeout"),
        "dead": (502, "upstream_error"),
        "nope": (404, "refused"),
        "anon": (401, "refused"),
    }
    assert (seen["nope"]["team"], seen["nope"]["model"], seen["nope"]["pool"]) == (
        "team-a",
        "nope",
        None,
    )
    assert seen["anon"]["team"] is None
    assert seen["dead"]["upstream"] is not None
    # Cut before its usage: charged what was counted, not more than was asked.
    assert 0 < int(seen["gone"]["completion_tokens"]) < 2000  # type: ignore[call-overload]
    text = stack.gateway.log_text()
    assert SECRET not in text and "sk-unknown" not in text
    assert '"path":"/readyz"' not in text  # the probes are not logged
