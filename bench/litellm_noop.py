"""A LiteLLM callback that does nothing, at the hooks fairshare's callback uses: the control
of bench/gateway_peer.py.

LiteLLM's proxy does work for every callback it runs, whatever the callback does: it builds
each hook's arguments and, for a callback with log events, a logging payload per request.
This callback has the same hooks as ``fairshare.integrations.litellm`` (a test compares the
two) and returns at once from each: what a proxy running it adds over LiteLLM alone is the
least any callback at those hooks adds, fairshare's included.

LiteLLM loads ``bench.litellm_noop.handler`` (``litellm_settings.callbacks``); only its
proxy imports this module, which imports LiteLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litellm.integrations.custom_logger import CustomLogger  # type: ignore[import-not-found]


class NoopHandler(CustomLogger):  # type: ignore[misc]
    """Every hook of fairshare's callback, each doing nothing."""

    async def async_pre_call_hook(
        self, user_api_key_dict: object, cache: object, data: dict[str, Any], call_type: str
    ) -> dict[str, Any]:
        return data

    async def async_post_call_success_hook(
        self, data: dict[str, Any], user_api_key_dict: object, response: object
    ) -> None:
        return None

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: object,
        traceback_str: str | None = None,
    ) -> None:
        return None

    async def async_post_call_streaming_iterator_hook(
        self,
        user_api_key_dict: object,
        response: AsyncIterator[Any],
        request_data: dict[str, Any],
    ) -> AsyncIterator[Any]:
        async for chunk in response:
            yield chunk

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: object,
        response: object,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        return None

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: object, start_time: object, end_time: object
    ) -> None:
        return None

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: object, start_time: object, end_time: object
    ) -> None:
        return None


handler = NoopHandler()
