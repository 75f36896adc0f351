"""fairshare as a callback of LiteLLM's proxy (docs/litellm.md): a LiteLLM team is a
fairshare team, a LiteLLM model group a pool.

LiteLLM loads ``fairshare.integrations.litellm.handler`` named in its config
(``litellm_settings.callbacks``); the first access to ``handler`` imports ``litellm``,
reads the settings (``fairshare.integrations.litellm_config``; an error names the key and
the proxy does not start) and makes the one ``CustomLogger`` of the process. Importing
this module needs no LiteLLM: ``Fairshare``, which does the work, is plain Python over the
client library.

For one request of a model group that maps to a pool (chat, completions, embeddings,
responses):

1. before the call (``async_pre_call_hook``): the team (``TeamSettings.sources`` in order:
   LiteLLM's key, a header, the request's metadata), the class, an acquire
   (``fairshare.client.AllocatorClient``, which applies the pool's degraded mode when no
   replica answers); the grant's ``priority`` goes into ``extra_body``, which LiteLLM's
   OpenAI-compatible providers (``openai/``, ``hosted_vllm/``) merge into the body sent
   upstream; a ``priority`` the client sent is dropped. A stream of chat or completions
   asks for its usage (``stream_options.include_usage``), whose chunk the client sees only
   if it asked for it too. No team: 401; ``NoOwner`` (a ``fail_closed`` pool without an
   owner): 503; a limit of the allocator: 429; another allocator error: 500.
2. the answer carries the ``x-fairshare-*`` headers of the gateway (priority, standing,
   borrowing, degraded, pool) through ``async_post_call_response_headers_hook``.
3. the grant is released once, with the charge (``fairshare.cost``, the gateway's rule),
   by whichever of these comes first: the success hook (non-streaming: the answer's
   ``usage``), the end of the stream however it ends (the streaming iterator hook: the
   usage chunk, else the chunks counted and the estimated prompt; the client gone closes
   the iterator), the failure hook (an upstream error status charges 0, a timeout or a
   broken connection the estimated prompt), or, as a backstop, LiteLLM's success and
   failure log events. After the success hook the Release starts
   ``RELEASE_AFTER_ANSWER_S`` later, once LiteLLM has sent the answer.

Guarantees: a grant is released at most once (``Fairshare.in_flight`` counts those not
yet); a release runs as a task of its own, so a cancelled request still gives its grant
back. Not guaranteed: a request LiteLLM drops without any of the hooks above (its grant
counts until the holder session lapses when the proxy stops, or the pool's
``max_request_s``); the client library is not closed when the proxy stops (LiteLLM gives
callbacks no shutdown hook), so releases still buffered then are lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

from fairshare import Class
from fairshare.client import AllocatorClient, ClientGrant, NoOwner
from fairshare.cost import Usage, charge
from fairshare.errors import AllocatorError, LimitExceeded
from fairshare.estimate import Endpoint, estimate_prompt_tokens
from fairshare.integrations.litellm_config import CLASSES, Settings, TeamSettings, load

ENDPOINTS: Final[dict[str, Endpoint]] = {
    "completion": "chat",
    "acompletion": "chat",
    "text_completion": "completions",
    "atext_completion": "completions",
    "embeddings": "embeddings",
    "aembedding": "embeddings",
    "responses": "responses",
    "aresponses": "responses",
}
"""LiteLLM's call types that are decided, and the endpoint of each; others pass as they are."""
MAX_TOKEN_FIELDS: Final = ("max_completion_tokens", "max_tokens", "max_output_tokens")
HEADERS_KEY: Final = "fairshare_headers"
"""Where the answer's headers wait in the request's LiteLLM metadata (plain strings)."""
RETRY_AFTER_S: Final = "1"
"""``Retry-After`` of a 503 (no owner) or 429 (a limit): as the gateway's."""
RELEASE_AFTER_ANSWER_S: Final = 0.005
"""How long after the success hook a whole answer's grant is released. The hook runs
before LiteLLM sends the answer, and a Release started there shares LiteLLM's event loop
with the answer's last steps (serializing it, its headers, writing it): paired with an
immediate Release in one run, this delay took 0.20 to 0.54 ms off the request in each of
three rounds, and 20 ms 0.14 to 0.64 ms (docs/litellm.md, "Added latency"). The grant
counts that much longer."""
CUT_SHORT: Final = ("Timeout", "APIConnectionError", "CancelledError")
"""Failures after which the upstream may have read the prompt: charged the estimate."""

logger = logging.getLogger(__name__)


class Refused(Exception):
    """The request is refused before any upstream: ``status``, the message, ``headers``."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


@dataclass
class Held:
    """One request's grant, until it is released."""

    grant: ClientGrant
    prompt_tokens: int
    """The estimate, charged when the request is cut before any usage."""
    client_wants_usage: bool
    started: float
    streaming: bool = False
    """The stream iterator has started: it releases, the failure hook leaves it."""


def _attr(obj: object, name: str) -> object:
    value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
    return value


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _metadata(data: Mapping[str, Any]) -> Mapping[str, object]:
    """The request's metadata as the client sent it (LiteLLM adds its own keys beside)."""
    for name in ("metadata", "litellm_metadata"):
        value = data.get(name)
        if isinstance(value, Mapping):
            return value
    return {}


def _header(data: Mapping[str, Any], name: str) -> str | None:
    server_request = data.get("proxy_server_request")
    headers = _attr(server_request, "headers") if server_request is not None else None
    if not isinstance(headers, Mapping):
        return None
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name:
            return _text(value)
    return None


def team_of(key: object, data: Mapping[str, Any], settings: TeamSettings) -> str | None:
    """The request's team: the first of ``settings.sources`` that names one (``key`` is
    LiteLLM's ``UserAPIKeyAuth``), else ``settings.default``."""
    for source in settings.sources:
        if source in ("team_alias", "team_id", "key_alias"):
            found = _text(_attr(key, source))
        elif source == "header":
            found = _header(data, settings.header)
        else:
            found = _text(_metadata(data).get(settings.metadata))
        if found is not None:
            return found
    return settings.default


def class_of(key: object, data: Mapping[str, Any], name: str, default: Class) -> Class:
    """The request's class: its metadata's ``name``, else its key's, else ``default``.

    Raises:
        Refused: 400, a name that is no class.
    """
    for metadata in (_metadata(data), _attr(key, "metadata")):
        value = metadata.get(name) if isinstance(metadata, Mapping) else None
        if value is None:
            continue
        found = CLASSES.get(str(value).strip().lower())
        if found is None:
            raise Refused(400, f"{name} must be one of {', '.join(CLASSES)}, got {value!r}")
        return found
    return default


def estimate(endpoint: Endpoint, data: Mapping[str, Any]) -> tuple[int, int]:
    """The prompt's estimated tokens and the completion's bound (``fairshare.estimate``)."""
    prompt = estimate_prompt_tokens(endpoint, data)
    for name in MAX_TOKEN_FIELDS:
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return prompt, value
    return prompt, 0


def usage_of(response: object) -> Usage | None:
    """The ``usage`` of a LiteLLM answer or chunk (an object or a mapping), or None."""
    usage = _attr(response, "usage")
    if usage is None:
        return None
    for prompt_name, completion_name in (
        ("prompt_tokens", "completion_tokens"),
        ("input_tokens", "output_tokens"),
    ):
        prompt, completion = _attr(usage, prompt_name), _attr(usage, completion_name)
        if isinstance(prompt, int):
            return Usage(prompt, completion if isinstance(completion, int) else 0)
    return None


def grant_headers(grant: ClientGrant) -> dict[str, str]:
    """The ``x-fairshare-*`` headers of an answer, the gateway's (docs/gateway.md)."""
    standing = "degraded" if grant.degraded else "borrowing" if grant.borrowing else "within"
    return {
        "x-fairshare-priority": str(grant.priority),
        "x-fairshare-standing": standing,
        "x-fairshare-borrowing": "true" if grant.borrowing else "false",
        "x-fairshare-degraded": "true" if grant.degraded else "false",
        "x-fairshare-pool": grant.pool,
    }


def _refusal(error: AllocatorError) -> Refused:
    if isinstance(error, NoOwner):
        return Refused(503, f"the allocator refused: {error}", {"Retry-After": RETRY_AFTER_S})
    if isinstance(error, LimitExceeded):
        headers = {"Retry-After": RETRY_AFTER_S, "x-fairshare-limit": error.limit}
        return Refused(429, f"the allocator refused: {error}", headers)
    return Refused(500, f"the allocator refused: {error}")


class Fairshare:
    """What the LiteLLM callback does (see the module doc), without LiteLLM's types."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: Callable[[], AllocatorClient] | None = None,
    ) -> None:
        """``client`` makes the client library's client (on the running event loop, at
        the first request); by default from ``settings.allocator``."""
        self.settings = settings
        self._make_client = client or self._default_client
        self._client: AllocatorClient | None = None
        self._held: dict[str, Held] = {}
        self._releases: set[asyncio.Task[None]] = set()
        self._deferred: set[asyncio.TimerHandle] = set()  # releases due soon

    def _default_client(self) -> AllocatorClient:
        allocator = self.settings.allocator
        return AllocatorClient(
            allocator.endpoints, holder=allocator.holder, deadline_s=allocator.deadline_s
        )

    @property
    def in_flight(self) -> int:
        """Grants acquired and not released yet (a release due soon included)."""
        return len(self._held) + len(self._deferred)

    @property
    def client(self) -> AllocatorClient:
        if self._client is None:
            self._client = self._make_client()
        return self._client

    # -- before the call ---------------------------------------------------------------------

    async def before(self, key: object, data: MutableMapping[str, Any], call_type: str) -> None:
        """Acquires the request's grant and writes its priority into ``data`` (a request
        of a model group with no pool, or of another call type, is left as it is).

        Raises:
            Refused: no team (401), a wrong class (400), the allocator's refusal.
        """
        endpoint = ENDPOINTS.get(call_type)
        call_id = data.get("litellm_call_id")
        model = data.get("model")
        if endpoint is None or not isinstance(call_id, str) or not isinstance(model, str):
            return
        pool = self.settings.pool_of(model)
        if pool is None:
            return
        team = team_of(key, data, self.settings.team)
        if team is None:
            sources = ", ".join(self.settings.team.sources)
            raise Refused(401, f"no fairshare team for this request (looked at: {sources})")
        classes = self.settings.service_class
        service_class = class_of(key, data, classes.metadata, classes.default)
        prompt, bound = estimate(endpoint, data)
        try:
            grant = await self.client.acquire(
                pool, team, service_class, prompt + bound, wait_s=self.settings.borrow_wait_s
            )
        except AllocatorError as e:
            raise _refusal(e) from e
        options = data.get("stream_options")
        wants_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
        self._held[call_id] = Held(
            grant, prompt, client_wants_usage=wants_usage, started=time.monotonic()
        )
        data.pop("priority", None)  # the grant's, not the client's
        extra = data.get("extra_body")
        data["extra_body"] = {
            **(extra if isinstance(extra, Mapping) else {}),
            "priority": grant.priority,
        }
        if data.get("stream") is True and endpoint in ("chat", "completions"):
            data["stream_options"] = {**(options or {}), "include_usage": True}
        if self.settings.headers:
            metadata = data.setdefault("metadata", {})
            if isinstance(metadata, MutableMapping):
                metadata[HEADERS_KEY] = grant_headers(grant)

    def headers(self, data: Mapping[str, Any]) -> dict[str, str] | None:
        """The answer's ``x-fairshare-*`` headers (None: not decided, or turned off)."""
        found = _metadata(data).get(HEADERS_KEY)
        return dict(found) if isinstance(found, Mapping) else None

    # -- after the call ----------------------------------------------------------------------

    def _release(self, data: Mapping[str, Any], usage: Usage | None, *, after_s: float = 0) -> None:
        """Releases the request's grant (once: later calls find none) in a task of its own,
        started ``after_s`` from now (charged as of now)."""
        call_id = data.get("litellm_call_id")
        held = self._held.pop(call_id, None) if isinstance(call_id, str) else None
        if held is None:
            return
        upstream_s = time.monotonic() - held.started
        consumed = charge(self.settings.cost, usage=usage, upstream_s=upstream_s)
        loop = asyncio.get_running_loop()

        def start() -> None:
            task = loop.create_task(held.grant.release(consumed))
            self._releases.add(task)
            task.add_done_callback(self._released)

        if after_s <= 0:
            start()
            return

        def due_now() -> None:
            self._deferred.discard(due)
            start()

        due = loop.call_later(after_s, due_now)
        self._deferred.add(due)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releases.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a grant release failed: %r", task.exception())

    def succeeded(self, data: Mapping[str, Any], response: object) -> None:
        """A whole answer: released with its usage."""
        held = self._held.get(str(data.get("litellm_call_id")))
        if held is None or held.streaming:
            return
        usage = usage_of(response)
        self._release(data, usage or Usage(held.prompt_tokens, 0), after_s=RELEASE_AFTER_ANSWER_S)

    def failed(self, data: Mapping[str, Any], error: BaseException) -> None:
        """The call failed: released with 0 when the upstream answered with an error
        status, the estimated prompt when it was cut (a timeout, a broken connection)."""
        held = self._held.get(str(data.get("litellm_call_id")))
        if held is None or held.streaming:
            return
        cut = type(error).__name__ in CUT_SHORT
        self._release(data, Usage(held.prompt_tokens, 0) if cut else None)

    def logged(self, kwargs: Mapping[str, Any], response: object, *, success: bool) -> None:
        """LiteLLM's log event of the call: the backstop, for a request whose hooks did
        not release it (the iterator of a stream started is left to release)."""
        if success:
            self.succeeded(kwargs, response)
        else:
            self.failed(kwargs, RuntimeError("the call failed"))

    async def stream(
        self, response: AsyncIterator[Any], data: Mapping[str, Any]
    ) -> AsyncIterator[Any]:
        """The answer's chunks as they come, the usage read (its chunk dropped when the
        client did not ask for it); released when the stream ends, however it ends."""
        held = self._held.get(str(data.get("litellm_call_id")))
        if held is None:
            async for chunk in response:
                yield chunk
            return
        held.streaming = True
        usage: Usage | None = None
        chunks = 0
        try:
            async for chunk in response:
                found = usage_of(chunk)
                if found is not None:
                    usage = found
                    if not held.client_wants_usage and not _attr(chunk, "choices"):
                        continue
                else:
                    chunks += 1
                yield chunk
        finally:
            self._release(data, usage or Usage(held.prompt_tokens, chunks))


def _handler_class() -> type:
    """The ``CustomLogger`` of the callback (LiteLLM imported here, and only here)."""
    from fastapi import HTTPException  # LiteLLM's proxy runs on FastAPI
    from litellm.integrations.custom_logger import CustomLogger

    class FairshareHandler(CustomLogger):  # type: ignore[misc]
        """LiteLLM's hooks, each handing over to ``Fairshare`` (see the module doc)."""

        def __init__(self, fairshare: Fairshare) -> None:
            super().__init__()
            self.fairshare = fairshare

        async def async_pre_call_hook(
            self, user_api_key_dict: object, cache: object, data: dict[str, Any], call_type: str
        ) -> dict[str, Any]:
            try:
                await self.fairshare.before(user_api_key_dict, data, call_type)
            except Refused as e:
                raise HTTPException(status_code=e.status, detail=str(e), headers=e.headers) from e
            return data

        async def async_post_call_success_hook(
            self, data: dict[str, Any], user_api_key_dict: object, response: object
        ) -> None:
            self.fairshare.succeeded(data, response)

        async def async_post_call_failure_hook(
            self,
            request_data: dict[str, Any],
            original_exception: Exception,
            user_api_key_dict: object,
            traceback_str: str | None = None,
        ) -> None:
            self.fairshare.failed(request_data, original_exception)

        async def async_post_call_streaming_iterator_hook(
            self,
            user_api_key_dict: object,
            response: AsyncIterator[Any],
            request_data: dict[str, Any],
        ) -> AsyncIterator[Any]:
            async for chunk in self.fairshare.stream(response, request_data):
                yield chunk

        async def async_post_call_response_headers_hook(
            self,
            data: dict[str, Any],
            user_api_key_dict: object,
            response: object,
            request_headers: dict[str, str] | None = None,
            litellm_call_info: dict[str, object] | None = None,
        ) -> dict[str, str] | None:
            return self.fairshare.headers(data)

        async def async_log_success_event(
            self, kwargs: dict[str, Any], response_obj: object, start_time: object, end_time: object
        ) -> None:
            self.fairshare.logged(kwargs, response_obj, success=True)

        async def async_log_failure_event(
            self, kwargs: dict[str, Any], response_obj: object, start_time: object, end_time: object
        ) -> None:
            self.fairshare.logged(kwargs, response_obj, success=False)

    return FairshareHandler


_handler: object | None = None


def __getattr__(name: str) -> object:
    """``handler``: the callback LiteLLM's config names, made at its first access."""
    global _handler  # noqa: PLW0603 (one callback per process, made when LiteLLM asks)
    if name != "handler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _handler is None:
        _handler = _handler_class()(Fairshare(load()))
    return _handler
