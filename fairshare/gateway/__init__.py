"""``fairshare gateway``: an OpenAI-compatible proxy that puts the allocator's priority on
every vLLM request (docs/gateway.md).

One process: an aiohttp server for clients, one aiohttp ``ClientSession`` for the vLLM
upstreams, and one ``client.AllocatorClient`` for the allocator, all on one event loop, so
a client's disconnect cancels the upstream request and releases the grant at once.

Modules: ``fairshare.gateway.config`` (the YAML file), ``fairshare.gateway.keys`` (the API keys
file, followed), ``fairshare.gateway.identity`` (who is calling), ``fairshare.gateway.body`` (what
is read from and written into request bodies and streamed chunks), the core's ``fairshare.cost``
(what a release charges), ``fairshare.gateway.errors`` (the one table of error answers),
``fairshare.gateway.upstreams`` (which vLLM server), ``fairshare.gateway.health`` (which
upstreams get requests: probes, ejection), ``fairshare.gateway.placement`` (the grant, and
fallback pools), ``fairshare.gateway.redecide`` (fail-open requests sent again after an outage),
``fairshare.gateway.releases`` (releases that outlive a cancelled request),
``fairshare.gateway.proxy`` (the request path), ``fairshare.gateway.forward`` (one attempt at
the upstream), ``fairshare.gateway.headers`` (which headers cross, the request id),
``fairshare.gateway.middleware`` (around every request: its id, its log line, 404s),
``fairshare.gateway.accesslog`` (one line per request), ``fairshare.gateway.policy`` (the
upstreams' scheduling policy, checked at startup), ``fairshare.gateway.poolcheck`` (the
models' pools against the allocator's), ``fairshare.gateway.connections`` (client
connections: the cap, the head timeout), ``fairshare.gateway.metrics`` (Prometheus),
``fairshare.gateway.app`` (startup, readiness, SIGTERM).

The package imports the client library (``client``) and the core (``fairshare``) of the
project, never the server or the replication layer.
"""
