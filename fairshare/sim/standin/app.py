"""The stand-in's aiohttp application: the OpenAI endpoints, the test controls, the records.

How a client that goes away is seen: the server runs with aiohttp's handler cancellation
(``handler_cancellation=True``), so when a connection closes aiohttp cancels the task of
the request on it at once, whether the request waits for a slot, sleeps before its next
token or waits to send its whole answer. The ``CancelledError`` reaches the handler, which
frees the slot (``Scheduler`` leaves the queue or ``release``), marks the record
``disconnected`` and ends. Cancellation was chosen over polling the transport because it is
prompt without any loop that checks; a write to a closed transport would only be noticed
at the next token, never while the request waits or a non-streaming answer is generated.

Guarantees: every request received is recorded before anything else happens to it; a
record's times are on this process's monotonic clock; every slot taken is given back on
every path. Not guaranteed: the records survive a restart (they are in memory).

Stored responses (``--store-responses``, vLLM's ``VLLM_ENABLE_RESPONSES_API_STORE=1``): a
Responses answer whose request did not say ``store: false`` is kept in this process's memory
once complete, and ``GET /v1/responses/{id}`` returns it (with ``stream=true``, as a
stream of its ``response.created`` and ``response.completed`` events, those numbered after
``starting_after`` only); ``POST /v1/responses/{id}/cancel``
answers 400 for it, as vLLM does for a response that is not running in the background.
Both answer vLLM's 404 for an id this process does not hold, and 404 ``Not Found`` without
the flag (vLLM serves them always, its store empty). Answer ids carry a tag of this
process, so two stand-ins never make the same id.

Headers: a record keeps the request's headers (names in lower case). Every answer echoes
the request's ``x-request-id``, as vLLM does with ``--enable-request-id-headers``, and
carries the headers the body's ``standin_headers`` asks for.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from fairshare.sim.standin.scheduler import Policy, Scheduler
from fairshare.sim.standin.shapes import (
    Ask,
    BadRequest,
    Kind,
    StreamShapes,
    error_body,
    parse,
    sse,
)

ANSWER_HEADERS: Final = "standin.headers"
"""Where a request keeps the headers its answer is to carry (aiohttp's request mapping)."""


@dataclass(frozen=True)
class Settings:
    """The command line's choices (see ``fairshare.sim.standin.command``)."""

    models: tuple[str, ...] = ("standin",)
    max_running: int = 4
    tokens_per_s: float = 50.0
    prefill_s: float = 0.0
    policy: Policy = "priority"
    max_tokens_default: int = 16
    dev_mode: bool = False
    store_responses: bool = False


class Standin:
    """The state of one server: its settings, scheduler and records."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scheduler = Scheduler(settings.max_running, settings.policy)
        self.records: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._tag = secrets.token_hex(4)
        self.stored: dict[str, dict[str, Any]] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.on_response_prepare.append(self._answer_headers)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/embeddings", self.embeddings)
        if self.settings.store_responses:
            app.router.add_get("/v1/responses/{id}", self.retrieve)
            app.router.add_post("/v1/responses/{id}/cancel", self.cancel)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/standin/requests", self.list_records)
        app.router.add_delete("/standin/requests", self.forget_records)
        return app

    async def _answer_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        if "x-request-id" in request.headers:
            response.headers["x-request-id"] = request.headers["x-request-id"]
        for name, value in request.get(ANSWER_HEADERS, ()):
            response.headers.add(name, value)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": name}
            | {"parent": None, "max_model_len": 4096}
            for name in self.settings.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def server_info(self, request: web.Request) -> web.Response:
        """vLLM's ``GET /server_info``, the one place a running vLLM tells its scheduling
        policy; vLLM serves it only with ``VLLM_SERVER_DEV_MODE=1`` (here: ``--dev-mode``),
        404 otherwise. Only the fields a client may read are imitated:
        ``vllm_config.scheduler_config.policy`` and ``max_num_seqs`` under
        ``config_format=json``; the text form is a string with no contract."""
        if not self.settings.dev_mode:
            return web.json_response({"detail": "Not Found"}, status=404)
        scheduler = {"policy": self.settings.policy, "max_num_seqs": self.settings.max_running}
        if request.query.get("config_format", "text") == "json":
            config: Any = {
                "model_config": {"model": self.settings.models[0]},
                "scheduler_config": scheduler,
            }
        else:
            config = f"model='{self.settings.models[0]}', scheduler_config={scheduler}"
        env = {"VLLM_SERVER_DEV_MODE": True}
        return web.json_response({"vllm_config": config, "vllm_env": env, "system_env": {}})

    async def list_records(self, request: web.Request) -> web.Response:
        return web.json_response(self.records)

    async def forget_records(self, request: web.Request) -> web.Response:
        self.records = []
        return web.json_response({"forgotten": True})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "responses")

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        stored = self.stored.get(request.match_info["id"])
        if stored is None:
            return self._not_stored(request)
        if request.query.get("stream") != "true":
            return web.json_response(stored)
        after = int(request.query.get("starting_after", "-1"))
        events = [("response.created", stored | {"status": "in_progress", "output": []})]
        events.append(("response.completed", stored))
        answer = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await answer.prepare(request)
        for number, (kind, response) in enumerate(events):
            if number > after:
                data = {"type": kind, "sequence_number": number, "response": response}
                await answer.write(f"event: {kind}\n".encode() + sse(data))
        await answer.write_eof()
        return answer

    async def cancel(self, request: web.Request) -> web.Response:
        if request.match_info["id"] not in self.stored:
            return self._not_stored(request)
        message = "Cannot cancel a synchronous response."
        return web.json_response(error_body(400, message), status=400)

    def _not_stored(self, request: web.Request) -> web.Response:
        message = f"Response with id '{request.match_info['id']}' not found."
        return web.json_response(error_body(404, message), status=404)

    def _store(self, ask: Ask, body: Any, answer: dict[str, Any]) -> None:
        """Keeps a complete Responses answer when this server stores them (the module doc)."""
        stores = self.settings.store_responses and ask.kind == "responses"
        if stores and body.get("store") is not False:
            self.stored[answer["id"]] = answer

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        """Embeddings take a slot like generation (vLLM schedules pooling requests with
        their ``priority`` too), for ``prefill_s``, and produce no tokens."""
        return await self._generate(request, "embeddings")

    def _record(self, request: web.Request, body: Any) -> dict[str, Any]:
        record: dict[str, Any] = {
            "id": str(next(self._ids)),
            "model": None,
            "priority": None,
            "stream": None,
            "include_usage": None,
            "max_tokens": None,
            "arrival_s": time.monotonic(),
            "start_s": None,
            "first_token_s": None,
            "end_s": None,
            "prompt_tokens": None,
            "completion_tokens": 0,
            "disconnected": False,
            "status": None,
            "path": request.path,
            "headers": {name.lower(): value for name, value in request.headers.items()},
            "body": body,
        }
        self.records.append(record)
        return record

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            record = self._record(request, None)
            return self._error(record, 400, "the body is not valid JSON")
        record = self._record(request, body)
        try:
            ask = parse(
                body,
                kind=kind,
                models=self.settings.models,
                max_tokens_default=self.settings.max_tokens_default,
            )
        except BadRequest as refused:
            return self._error(record, refused.status, str(refused))
        request[ANSWER_HEADERS] = ask.headers
        record |= {
            "model": ask.model,
            "priority": ask.priority,
            "stream": ask.stream,
            "include_usage": ask.include_usage,
            "max_tokens": ask.max_tokens,
            "prompt_tokens": ask.prompt_tokens,
        }
        if ask.status is not None:
            return self._error(record, ask.status, f"standin_status {ask.status} asked for")
        try:
            if ask.hang:
                await asyncio.get_running_loop().create_future()  # until the client goes
            await self.scheduler.admit(ask.priority)
            try:
                record["start_s"] = time.monotonic()
                if ask.stream:
                    return await self._stream(request, ask, record, body)
                return await self._whole(ask, record, body)
            finally:
                self.scheduler.release()
        except (asyncio.CancelledError, ConnectionResetError):
            record["disconnected"] = True  # a write may notice the close before the cancel
            raise
        finally:
            if record["end_s"] is None:
                record["end_s"] = time.monotonic()

    def _error(self, record: dict[str, Any], status: int, message: str) -> web.Response:
        record["status"] = status
        record["end_s"] = time.monotonic()
        return web.json_response(error_body(status, message), status=status)

    async def _token_due(self, record: dict[str, Any], index: int) -> None:
        """Sleeps until token ``index`` is due: the first ``prefill_s`` after the start, the
        next ones ``1 / tokens_per_s`` apart (on absolute times, so no drift)."""
        due = record["start_s"] + self.settings.prefill_s + index / self.settings.tokens_per_s
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _produced(self, record: dict[str, Any], index: int) -> None:
        if index == 0:
            record["first_token_s"] = time.monotonic()
        record["completion_tokens"] = index + 1

    def _shapes(self, ask: Ask, record: dict[str, Any]) -> StreamShapes:
        """The answer's shapes, its id tagged with this process's tag."""
        return StreamShapes(ask, f"{self._tag}{record['id']}")

    async def _whole(self, ask: Ask, record: dict[str, Any], body: Any) -> web.Response:
        if ask.kind == "embeddings":
            await self._token_due(record, 0)  # the prefill
        for index in range(ask.max_tokens):
            await self._token_due(record, index)
            self._produced(record, index)
        record["status"] = 200
        answer = self._shapes(ask, record).whole()
        self._store(ask, body, answer)
        return web.json_response(answer)

    async def _stream(
        self, request: web.Request, ask: Ask, record: dict[str, Any], body: Any
    ) -> web.StreamResponse:
        shapes = self._shapes(ask, record)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        record["status"] = 200
        for event in shapes.head():
            await response.write(event)
        for index in range(ask.max_tokens):
            if ask.fail_after is not None and index >= ask.fail_after:
                record["end_s"] = time.monotonic()
                record["failed"] = True
                assert request.transport is not None
                request.transport.abort()
                return response
            await self._token_due(record, index)
            self._produced(record, index)
            await response.write(shapes.token(index))
        for event in shapes.tail(ask.max_tokens):
            await response.write(event)
        if ask.kind == "responses":
            self._store(ask, body, shapes.response(ask.max_tokens))
        await response.write_eof()
        return response
