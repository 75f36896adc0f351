"""The request path: identify, parse, place, forward, answer, release.

``Proxy`` serves ``POST /v1/chat/completions``, ``POST /v1/completions`` and
``POST /v1/responses`` (streaming and not), ``POST /v1/embeddings`` (vLLM schedules pooling
requests by ``priority`` too, so they are decided and charged like the rest: by their
prompt tokens), ``GET /v1/models`` and ``GET /v1/models/{id}`` (the configured models; 404
``model_not_found`` for another), ``GET /v1/responses/{id}`` and ``POST
/v1/responses/{id}/cancel`` (a stored response's, sent with no grant to the server that
made it, for the team it was made for: ``fairshare.gateway.stored``; 404 ``not_found``
for an id this gateway did not pass on for the team). Any other path is 404
``not_found``, a known path with another method 405, both in OpenAI's error shape
(``fairshare.gateway.middleware``). For one request:

1. the team and class (``fairshare.gateway.identity``; 401 without), the body
   (``fairshare.gateway.body``; 400, 413), the model (404 when not configured);
2. a grant (``fairshare.gateway.placement``: the primary pool, or a fallback when it is saturated);
   ``NoOwner`` (a ``fail_closed`` pool without an owner) is 503 with ``Retry-After``, a
   limit of the allocator (``LimitExceeded``: this gateway's grants in flight at the
   pool's ``max_in_flight_per_holder``, the pool's at ``max_in_flight``, ...) is 429 with
   ``Retry-After`` and ``x-fairshare-limit`` naming it;
3. the body with the grant's ``priority``, and the client's headers that pass
   (``fairshare.gateway.headers``, with the request's ``x-request-id``), go to the upstream
   the route's router chooses for that priority (``fairshare.gateway.upstreams``;
   ``fewest-ahead`` unless configured otherwise; a request continuing a stored response,
   ``previous_response_id``, to the server holding it when it is on the placement's
   route; an id not passed on for the team is 404 before any grant), through
   ``fairshare.gateway.forward``,
   which does the HTTP side of each attempt; a connection that cannot be opened goes to
   another one;
4. the answer goes back with the upstream's headers that pass and ``x-fairshare-priority``,
   ``-standing``, ``-borrowing``, ``-degraded`` and ``-pool``: a non-streaming answer whole,
   with the upstream's status and body; a stream event by event
   (``fairshare.gateway.body.StreamFilter``), its status line sent only when the first
   bytes arrive, so a stream that fails before it starts is answered with a status;
5. the grant is released once, with the charge (``fairshare.cost``), whatever way the
   request ended: answered, upstream error or timeout, the client gone (the handler is
   cancelled: the upstream connection is closed at once, so vLLM aborts the sequence),
   re-decided, or the gateway stopping.

A request holding a degraded grant is watched by ``fairshare.gateway.redecide`` until its first byte
goes to the client: if an owner answers for its pool meanwhile, its upstream request is
closed and it is placed and sent again, once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import aiohttp
from aiohttp import web

from fairshare.client import AllocatorClient, ClientGrant, NoOwner
from fairshare.cost import Usage, charge
from fairshare.errors import (
    AllocatorError,
    InvalidArgument,
    LimitExceeded,
    PermissionDenied,
    UnknownPool,
)
from fairshare.estimate import Endpoint
from fairshare.gateway import body as bodies
from fairshare.gateway.accesslog import AccessLog, Entry
from fairshare.gateway.body import BadJson, BadRequest, Request
from fairshare.gateway.config import GatewayConfig, Model, Route
from fairshare.gateway.errors import Refusal, error_response
from fairshare.gateway.forward import Forwarder, Outcome, UpstreamFailed, standing
from fairshare.gateway.headers import HeaderPolicy
from fairshare.gateway.health import Health
from fairshare.gateway.identity import FAIRNESS_ID_HEADER, BadClass, Unauthorized, identify
from fairshare.gateway.keys import Identity, KeysFile
from fairshare.gateway.metrics import GatewayMetrics
from fairshare.gateway.middleware import entry_of, install
from fairshare.gateway.placement import Placement, place
from fairshare.gateway.redecide import Redecide, Redecider, Watched, unless_signalled
from fairshare.gateway.releases import Releases
from fairshare.gateway.stored import Stored, StoredResponses
from fairshare.gateway.upstreams import Upstreams

logger = logging.getLogger(__name__)

PATHS: Final[Mapping[Endpoint, str]] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
}
"""The path of each endpoint, the same at the gateway and at the upstream."""
RETRY_AFTER_S: Final = "1"
"""What ``Retry-After`` says when no owner answers for a ``fail_closed`` pool, and when the
allocator refuses at a limit (429). One second: the bounds on grants in flight are
multiples of the pool's capacity, so a holder at its bound has many requests running and
one of them ends within about a second at the request lengths of an LLM; the OpenAI SDK
waits that long before each of its retries."""
LIMIT_HEADER: Final = "x-fairshare-limit"
"""The header of a 429 that names the allocator's limit met (``max_in_flight_per_holder``,
``max_in_flight``, ``max_teams`` ...), as its ``fairshare-limit`` metadata does."""
NO_RETRY_HEADER: Final = "x-should-retry"
"""Set to ``false`` on an answer no retry can change: the OpenAI SDKs, which retry every
5xx, then do not."""
READ_CHUNK: Final = 64 * 1024
"""Bytes of a request body read at a time (the body is bounded by ``max_body_bytes``)."""


class Refused(Exception):
    """The request is refused before any grant; ``refusal`` says how to answer."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


def grant_headers(grant: ClientGrant, acquire_s: float) -> dict[str, str]:
    """The ``x-fairshare-*`` headers of an answer: the priority, the standing in one word
    (``standing``: ``within`` share, ``borrowing`` or ``degraded``, the words of the
    gateway's metrics) and as the two flags it is made of, the pool, and the milliseconds
    the request waited for its grant (``acquire_s``: a borrower held by its pool's lending
    limit waits at the allocator)."""
    return {
        "x-fairshare-acquire-ms": f"{acquire_s * 1000:.0f}",
        "x-fairshare-priority": str(grant.priority),
        "x-fairshare-standing": standing(grant),
        "x-fairshare-borrowing": "true" if grant.borrowing else "false",
        "x-fairshare-degraded": "true" if grant.degraded else "false",
        "x-fairshare-pool": grant.pool,
    }


def allocator_refusal(error: AllocatorError) -> tuple[Refusal, dict[str, str]]:
    """How an allocator error is answered (and the headers it adds)."""
    if isinstance(error, NoOwner):
        return Refusal.NO_OWNER, {"Retry-After": RETRY_AFTER_S}
    if isinstance(error, UnknownPool):
        # A configuration error: asking again cannot help.
        return Refusal.UNKNOWN_POOL, {NO_RETRY_HEADER: "false"}
    if isinstance(error, LimitExceeded):
        return Refusal.REFUSED_BY_ALLOCATOR, {
            "Retry-After": RETRY_AFTER_S,
            LIMIT_HEADER: error.limit,
        }
    if isinstance(error, PermissionDenied):
        return Refusal.FORBIDDEN_BY_ALLOCATOR, {}
    if isinstance(error, InvalidArgument):
        return Refusal.BAD_FIELD, {}
    return Refusal.ALLOCATOR_ERROR, {"Retry-After": RETRY_AFTER_S}


class Proxy:
    """The request path of one gateway process (see the module doc)."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        client: AllocatorClient,
        session: aiohttp.ClientSession,
        keys: KeysFile | None,
        metrics: GatewayMetrics,
    ) -> None:
        self.config = config
        self.client = client
        self.session = session
        self.keys = keys
        self.metrics = metrics
        self.redecider = Redecider(config.redecide)
        client.on_owner_answer(self.redecider.owner_answered)
        self._by_name: dict[str, Model] = {}
        """The configured models by name (the first, were a name listed twice)."""
        self.upstreams: dict[Route, Upstreams] = {}
        for model in config.models:
            self._by_name.setdefault(model.name, model)
            for route in (model.primary, *model.fallback):
                if route not in self.upstreams:
                    self.upstreams[route] = Upstreams(
                        route.pool, route.upstreams, routing=route.routing, metrics=metrics
                    )
        # The headers that name the team or class are the gateway's: not sent upstream.
        fairness = FAIRNESS_ID_HEADER if config.auth.fairness_id else None
        self.header_policy = HeaderPolicy(
            deny=config.headers.deny,
            consumed=(config.auth.team_header, config.auth.class_header, fairness),
        )
        self.access_log = AccessLog(config.access_log)
        self.draining = False
        self.handlers: set[asyncio.Task[object]] = set()
        self.releases = Releases()
        self.stored = StoredResponses(config.limits.stored_responses)
        self.health = Health(
            config.health, [u for r in self.upstreams for u in r.upstreams], metrics=metrics
        )
        self.forwarder = Forwarder(
            self.upstreams,
            session=session,
            limits=config.limits,
            health=self.health,
            metrics=metrics,
        )

    # -- routes ------------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        """Installs the endpoints on ``app``, and what every request goes through
        (``fairshare.gateway.middleware``)."""
        install(app, access=self.access_log, draining=lambda: self.draining)
        for endpoint, path in PATHS.items():
            app.router.add_post(path, self._handler(endpoint))
        app.router.add_get("/v1/models", self.models)
        # A model's name may hold a slash (org/name), which clients send as %2F.
        app.router.add_get("/v1/models/{model:.+}", self.model)
        stored = self._tracking(self._relay_stored)
        app.router.add_get(PATHS["responses"] + "/{id}", stored, allow_head=False)
        app.router.add_post(PATHS["responses"] + "/{id}/cancel", stored)

    def _handler(
        self, endpoint: Endpoint
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, endpoint)

        return self._tracking(serve)

    def _tracking(
        self, serve: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``serve`` refused while the gateway stops, and its task kept in ``handlers``
        while it runs (the stop waits for them, then cancels them)."""

        async def handle(request: web.Request) -> web.StreamResponse:
            if self.draining:
                return _refuse(request, Refusal.SHUTTING_DOWN, "the gateway is stopping")
            task = asyncio.current_task()
            assert task is not None
            self.handlers.add(task)
            try:
                return await serve(request)
            finally:
                self.handlers.discard(task)

        return handle

    async def models(self, request: web.Request) -> web.StreamResponse:
        try:
            self._identity(request)
        except Refused as e:
            return _refuse(request, e.refusal, str(e))
        data = [_model_object(m) for m in self.config.models]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["model"]
        entry_of(request).model = name
        try:
            self._identity(request)
        except Refused as e:
            return _refuse(request, e.refusal, str(e))
        model = self._by_name.get(name)
        if model is None:
            return _refuse(request, Refusal.UNKNOWN_MODEL, f"the model {name!r} does not exist")
        return web.json_response(_model_object(model))

    async def _relay_stored(self, request: web.Request) -> web.StreamResponse:
        """A stored response's retrieval or cancel, at the server that made it."""
        try:
            identity = self._identity(request)
        except Refused as e:
            return _refuse(request, e.refusal, str(e))
        response_id = request.match_info["id"]
        stored = self.stored.find(response_id, identity.team)
        if stored is None:
            return _refuse(request, Refusal.NOT_FOUND, _not_stored(response_id))
        entry = entry_of(request)
        entry.model, entry.pool, entry.upstream = stored.model, stored.route.pool, stored.url
        sent = self.header_policy.to_upstream(request.headers, entry.request_id)
        del sent["Content-Type"]  # no body
        # The path is made here from the checked id, never from the client's path.
        path = f"{PATHS['responses']}/{response_id}"
        if request.method == "POST":  # the cancel: the only POST of this handler
            path += "/cancel"
        outcome = Outcome(upstream=stored.url)
        try:
            return await self.forwarder.relay(
                request, stored.url + path, sent, self.header_policy.to_client, outcome
            )
        finally:
            if outcome.cut:
                entry.ended = outcome.cut

    # -- one request -------------------------------------------------------------------------

    def _identity(self, request: web.Request) -> Identity:
        """Who the request is for (``fairshare.gateway.identity``), noted in the request's
        access log entry.

        Raises:
            Refused: 401 without an identity, 400 for a class header naming no class.
        """
        try:
            identity = identify(
                request.headers, peer=request.remote, auth=self.config.auth, keys=self.keys
            )
        except Unauthorized as e:
            raise Refused(Refusal.UNAUTHORIZED, str(e)) from e
        except BadClass as e:
            raise Refused(Refusal.BAD_FIELD, str(e)) from e
        entry = entry_of(request)
        entry.team, entry.service_class = identity.team, identity.service_class.name.lower()
        return identity

    async def _serve(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        try:
            identity, parsed, model = await self._admit(request, endpoint)
        except Refused as e:
            return _refuse(request, e.refusal, str(e))
        return await self._decide_and_forward(request, parsed, model, identity)

    async def _admit(
        self, request: web.Request, endpoint: Endpoint
    ) -> tuple[Identity, Request, Model]:
        """The caller's identity, the checked body and its model.

        Raises:
            Refused: 401, 400, 413 or 404, as the module doc says.
        """
        identity = self._identity(request)
        limit = self.config.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := await request.content.read(READ_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
        except (aiohttp.ClientError, OSError) as e:
            raise Refused(Refusal.BAD_JSON, f"the body could not be read: {e}") from e
        raw = b"".join(chunks)
        try:
            parsed = bodies.parse_request(raw, endpoint)
        except BadJson as e:
            raise Refused(Refusal.BAD_JSON, str(e)) from e
        except BadRequest as e:
            raise Refused(Refusal.BAD_FIELD, str(e)) from e
        entry_of(request).model = parsed.model
        model = self._by_name.get(parsed.model)
        if model is None:
            raise Refused(Refusal.UNKNOWN_MODEL, f"the model {parsed.model!r} does not exist")
        return identity, parsed, model

    async def _decide_and_forward(
        self, request: web.Request, parsed: Request, model: Model, identity: Identity
    ) -> web.StreamResponse:
        redone = False
        arrived = time.monotonic()  # a re-decided request keeps its first arrival
        entry = entry_of(request)
        previous = parsed.previous_response_id
        continued = None if previous is None else self.stored.find(previous, identity.team)
        if previous is not None and continued is None:
            return _refuse(request, Refusal.NOT_FOUND, _not_stored(previous))
        while True:
            placed = await self._place(request, parsed, model, identity)
            if isinstance(placed, web.Response):
                return placed
            placement, waited = placed
            prefer = None
            if continued is not None and continued.route == placement.route:
                prefer = continued.url
            grant = placement.grant
            kind = "degraded" if grant.degraded else "borrowing" if grant.borrowing else "within"
            self.metrics.grants_by(grant.pool, kind).inc()
            if placement.fallback:
                self.metrics.fallbacks_by(model.name, grant.pool).inc()
            entry.pool, entry.priority, entry.standing = grant.pool, grant.priority, kind
            watched = self.redecider.watch(grant.pool) if grant.degraded and not redone else None
            outcome = Outcome()
            in_flight = self.metrics.in_flight_by(grant.pool)
            in_flight.inc()
            redecided = False
            try:
                response = await self._forward(
                    request, parsed, placement, watched, outcome, acquire_s=waited, prefer=prefer
                )
            except Redecide:
                redecided = True
            finally:
                if watched is not None:
                    self.redecider.unwatch(watched)
                in_flight.dec()
                if not redecided:
                    self._release(grant, outcome, entry)
            if redecided:
                # Released before the new decision, so that it does not count this request
                # twice; the aborted attempt charges nothing.
                redone = True
                self.metrics.redecided.labels(grant.pool).inc()
                logger.info("pool %s: a fail-open request is decided again", grant.pool)
                # A disconnect meanwhile does not cut the release (a task of its own).
                await asyncio.shield(self.releases.start(grant, 0.0))
                continue
            self.metrics.requests_by(model.name, grant.pool, str(outcome.status)).inc()
            if parsed.store and outcome.response_id is not None and outcome.status == 200:  # noqa: PLR2004 (HTTP OK)
                where = Stored(model.name, placement.route, outcome.upstream, identity.team)
                self.stored.note(outcome.response_id, where)
            if outcome.first_chunk is not None:
                waited = outcome.first_chunk - arrived
                self.metrics.first_token_by(grant.pool, kind).observe(waited)
            return response

    async def _place(
        self, request: web.Request, parsed: Request, model: Model, identity: Identity
    ) -> tuple[Placement, float] | web.Response:
        """The request's placement and the seconds it took (a borrower held by its pool's
        lending limit waits for its grant up to ``limits.borrow_wait_s``), or the answer
        of the allocator's refusal."""
        started = time.monotonic()
        acquiring = self.metrics.acquiring_by(model.primary.pool)
        acquiring.inc()
        try:
            placement = await place(
                self.client,
                model,
                identity,
                parsed.est_tokens,
                self.releases,
                wait_s=self.config.limits.borrow_wait_s,
            )
        except AllocatorError as e:
            refusal, headers = allocator_refusal(e)
            self.metrics.requests_by(model.name, "", str(refusal.value.status)).inc()
            entry_of(request).pool = model.primary.pool
            message = f"the allocator refused: {e}"
            return _refuse(request, refusal, message, headers=headers)
        finally:
            acquiring.dec()
        waited = time.monotonic() - started
        self.metrics.acquire_seconds_by(model.primary.pool).observe(waited)
        return placement, waited

    def _release(self, grant: ClientGrant, outcome: Outcome, entry: Entry) -> None:
        """Releases ``grant`` in the background (the answer does not wait for it), and notes
        what the attempt used in the request's access log ``entry``.

        The release starts before anything else is done with the charge, so that nothing
        that fails here can leave the grant counted; the charge is never negative.
        """
        consumed = max(
            charge(self.config.cost, usage=outcome.usage, upstream_s=outcome.upstream_s), 0.0
        )
        self.releases.start(grant, consumed)
        self.metrics.charged_by(grant.pool).inc(consumed)
        entry.upstream, entry.charged = outcome.upstream or None, consumed
        if outcome.usage is not None:
            entry.prompt_tokens = outcome.usage.prompt_tokens
            entry.completion_tokens = outcome.usage.completion_tokens
        if outcome.cut:
            entry.ended = outcome.cut

    async def wait_releases(self) -> None:
        """Waits for the releases handed to the client library (at shutdown)."""
        await self.releases.wait()

    # -- the upstream ------------------------------------------------------------------------

    async def _forward(
        self,
        request: web.Request,
        parsed: Request,
        placement: Placement,
        watched: Watched | None,
        outcome: Outcome,
        *,
        acquire_s: float,
        prefer: str | None = None,
    ) -> web.StreamResponse:
        """One attempt at the upstream; fills ``outcome``; ``acquire_s``: the time its grant
        took (an answer header); ``prefer``: the upstream to try first (``Forwarder.first``).

        Raises:
            Redecide: ``watched`` was signalled before the first byte went to the client.
        """
        grant = placement.grant
        data = bodies.upstream_body(parsed, grant.priority)
        headers = grant_headers(grant, acquire_s)
        path = PATHS[parsed.endpoint]
        sent = self.header_policy.to_upstream(request.headers, entry_of(request).request_id)
        opened: tuple[str, aiohttp.ClientResponse] | None = None
        answered_error = False  # the upstream answered with an error status
        try:
            try:
                first = self.forwarder.first(placement, path, data, sent, parsed, outcome, prefer)
                attempt = await unless_signalled(first, watched, self._closer(placement))
                opened, head = attempt
            except UpstreamFailed as e:
                outcome.status = e.refusal.value.status
                timeout = e.refusal is Refusal.UPSTREAM_TIMEOUT
                outcome.cut = "timeout" if timeout else "upstream_error"
                return error_response(e.refusal, str(e), headers=headers)
            _, upstream = opened
            outcome.status = upstream.status
            answered_error = upstream.status != 200  # noqa: PLR2004 (HTTP OK)
            if upstream.status >= 500:  # noqa: PLR2004 (server errors)
                outcome.cut = "upstream_error"
            if watched is not None:
                self.redecider.unwatch(watched)
            answer = self.header_policy.to_client(upstream.headers)
            answer.update(headers)  # the gateway's own
            if parsed.stream and upstream.status == 200:  # noqa: PLR2004 (HTTP OK)
                outcome.first_chunk = time.monotonic()
                return await self.forwarder.stream(request, parsed, upstream, head, answer, outcome)
            if not parsed.stream and upstream.status == 200:  # noqa: PLR2004 (HTTP OK)
                outcome.usage = bodies.usage_of_body(head)
                if parsed.endpoint == "responses":
                    outcome.response_id = bodies.response_id_of(head)
            return web.Response(status=upstream.status, body=head, headers=answer)
        except asyncio.CancelledError:
            if not self.draining:  # else cancelled by the stop, after the grace
                self.metrics.disconnects.inc()
            raise
        finally:
            # No upstream accepted a connection: no upstream time to charge.
            outcome.upstream_s = time.monotonic() - outcome.started if outcome.sent else 0.0
            if outcome.usage is None and outcome.sent and not answered_error:
                # Cut (timeout, broken, the client gone) before any usage: the upstream
                # may have read the prompt; charge it, without completion tokens.
                outcome.usage = Usage(prompt_tokens=parsed.prompt_tokens, completion_tokens=0)
            if opened is not None:
                self.forwarder.close(placement, *opened)

    def _closer(
        self, placement: Placement
    ) -> Callable[[tuple[tuple[str, aiohttp.ClientResponse], bytes]], None]:
        """Closes what a first attempt of ``placement`` opened (``unless_signalled``)."""
        return lambda done: self.forwarder.close(placement, *done[0])


def _model_object(model: Model) -> dict[str, object]:
    """A configured model as OpenAI's model object."""
    return {"id": model.name, "object": "model", "created": 0, "owned_by": "fairshare"}


def _refuse(
    request: web.Request,
    refusal: Refusal,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """The answer of a refusal by the gateway (or the allocator) before any upstream."""
    entry_of(request).ended = "refused"
    return error_response(refusal, message, headers=headers)


def _not_stored(response_id: str) -> str:
    return (
        f"no stored response {response_id!r} is known to this gateway for this team (one "
        "made through another gateway replica is known only there)"
    )


def _too_large(limit: int) -> Refused:
    return Refused(Refusal.TOO_LARGE, f"the body is larger than {limit} bytes")
