"""fairshare inside other LLM gateways: each one's hooks, on the client library.

Modules: ``fairshare.integrations.litellm`` (LiteLLM's proxy: the callback, docs/litellm.md)
and ``fairshare.integrations.litellm_config`` (its settings, checked at load).

The package imports the client library (``fairshare.client``), the wire protocol and the
core, never the server, the replication layer, ``fairshare gateway`` or the simulator. A
gateway's own package (``litellm``) is imported only by the module of that gateway, and
only when the gateway loads it: ``import fairshare`` never needs one.

Importing it first chooses how the gateway's gRPC polls its sockets
(``fairshare.wire.polling``) where the gateway has not imported ``grpc`` yet.
"""

from fairshare.wire.polling import use_polling_thread

use_polling_thread()
