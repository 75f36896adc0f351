"""How gRPC waits for its sockets in fairshare's own processes: on the thread that polls.

gRPC's core reads and writes its sockets through its EventEngine by default: a message
that arrives is read on one of the EventEngine's threads, which then wakes the thread
that polls the completion queue for grpc.aio, which wakes the event loop. Its earlier
poller (``epoll1``, still in gRPC) reads on the polling thread itself, so every message
wakes one thread fewer. Measured on a 2-core machine, one message each way on an open
stream between two grpc.aio processes, one every 50 ms: 0.66 to 0.71 ms the round trip
with both processes on the earlier poller, against 0.82 to 0.91 ms with the
EventEngine, and a quarter less CPU in the server; what it gives a whole request through
the gateway is in docs/deploy.md ("gRPC's polling").

``use_polling_thread`` chooses the earlier poller for the client channels
(``event_engine_client``) and the servers (``event_engine_listener``) of this process, by
gRPC's own switch, the ``GRPC_EXPERIMENTS`` environment variable, which gRPC reads once,
when ``grpc`` is first imported. So it is called first, before anything imports ``grpc``,
and only where fairshare owns the process: by the ``fairshare`` command
(``fairshare.cli``, every ``fairshare serve`` and ``fairshare gateway``) and by the
LiteLLM callback's package (``fairshare.integrations``), whose proxy then uses it too when
it has not imported ``grpc`` yet. The client library alone (``fairshare.client``) changes
nothing in the process that imports it. ``polling_environment`` gives a child process
the same choice (the benchmarks' baselines, which must poll as the service does).

Guarantees: an operator's own ``GRPC_EXPERIMENTS``, set before the process starts (even
empty: gRPC's defaults), is kept as it is; the module imports nothing of gRPC.

Not guaranteed: any effect once ``grpc`` was imported before the call (it returns False);
that a later gRPC still has these switches: the lock pins the gRPC this was measured with,
and a test checks that it knows them (an unknown one is logged, not an error).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Final

EXPERIMENTS_VARIABLE: Final = "GRPC_EXPERIMENTS"
"""gRPC core's switch of its experiments (a comma-separated list; ``-name`` turns one off)."""
POLLING_THREAD: Final = "-event_engine_client,-event_engine_listener"
"""The EventEngine off for client channels and servers: the polling thread reads."""


def polling_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` for a child process that polls as ``use_polling_thread`` chooses:
    with ``GRPC_EXPERIMENTS`` set to ``POLLING_THREAD`` unless it is set there already."""
    return {EXPERIMENTS_VARIABLE: POLLING_THREAD, **environment}


def use_polling_thread() -> bool:
    """Chooses the earlier poller for this process's gRPC, unless the operator set
    ``GRPC_EXPERIMENTS``; True when it is chosen here and ``grpc`` was not imported yet."""
    if EXPERIMENTS_VARIABLE in os.environ:
        return False
    os.environ[EXPERIMENTS_VARIABLE] = POLLING_THREAD
    return "grpc" not in sys.modules
