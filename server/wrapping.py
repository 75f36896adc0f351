"""``Wrapping``: the base of the server interceptors that wrap some methods' handlers.

A subclass says which handlers it takes (``takes``) and how it wraps one (``wrap``); the
base asks the server for each call's handler and answers the wrapped one, wrapping each
method's handler once. Guarantees: a handler the subclass does not take is answered
unchanged; the cache holds one entry per method the server has a handler for (only those
reach it), so it is bounded by the server's methods, not by what clients send.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from grpc import aio


class Wrapping(aio.ServerInterceptor):  # type: ignore[misc]
    """See the module doc."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def takes(self, handler: grpc.RpcMethodHandler) -> bool:
        """True for a handler this interceptor wraps."""
        raise NotImplementedError

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` of ``method`` wrapped (called once per method and handler)."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not self.takes(handler):
            return handler
        method: str = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self.wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
