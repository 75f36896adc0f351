"""The fairshare wire protocol, imported by both sides of it.

- ``fairshare.wire.pb``: the code generated from ``proto/`` (``make proto``,
  ``fairshare.wire.genproto``);
- ``fairshare.wire.convert``: messages to the core's values and back, the only such conversions;
- ``fairshare.wire.metadata``: every gRPC metadata key the protocol uses;
- ``fairshare.wire.errors``: the one table between the core's errors and status codes;
- ``fairshare.wire.channels``: the options of every channel opened to a replica;
- ``fairshare.wire.polling``: how gRPC polls its sockets in fairshare's own processes
  (imports no gRPC: it runs before ``grpc`` is imported).

It imports the core (``fairshare``), grpc and protobuf only, so the client library can be
installed without the server.
"""
