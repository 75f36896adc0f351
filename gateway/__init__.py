"""``fairshare gateway``: an OpenAI-compatible proxy that puts the allocator's priority on
every vLLM request (docs/gateway.md).

One process: an aiohttp server for clients, one aiohttp ``ClientSession`` for the vLLM
upstreams, and one ``client.AllocatorClient`` for the allocator, all on one event loop, so
a client's disconnect cancels the upstream request and releases the grant at once.

Modules: ``gateway.config`` (the YAML file), ``gateway.keys`` (the API keys file, followed),
``gateway.identity`` (who is calling), ``gateway.body`` (what is read from and written into
request bodies and streamed chunks), ``gateway.cost`` (what a release charges),
``gateway.errors`` (the one table of error answers), ``gateway.upstreams`` (which vLLM
server), ``gateway.placement`` (the grant, and fallback pools), ``gateway.redecide``
(fail-open requests sent again after an outage), ``gateway.releases`` (releases that
outlive a cancelled request), ``gateway.proxy`` (the request path),
``gateway.policy`` (the upstreams' scheduling policy, checked at startup),
``gateway.metrics`` (Prometheus), ``gateway.app`` (startup, readiness, SIGTERM).

The package imports the client library (``client``) and the core (``fairshare``) of the
project, never the server or the replication layer.
"""
