"""The token estimate of a request, what ``est_tokens`` of an Acquire carries: the rule
every front of the allocator applies (``fairshare gateway``, ``fairshare.gateway.body``; the
LiteLLM callback).

The prompt is not tokenized (a front does not know the model's tokenizer); it counts one
token per 4 characters of text, rounded up, over every message's text content (string
contents and the ``text`` of content parts), the prompt or the embeddings' ``input`` (a
string, a list of strings, or token ids counted one each), or a Responses request's
``instructions`` and ``input`` (a string, or items counted as chat messages), plus 4 per
chat message or input item for the template.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, Literal

Endpoint = Literal["chat", "completions", "embeddings", "responses"]

CHARS_PER_TOKEN: Final = 4
"""Characters of text counted as one token by the estimate."""
TOKENS_PER_MESSAGE: Final = 4
"""Tokens counted for each chat message's template around its content."""


def _text_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                total += len(part["text"])
            elif isinstance(part, str):
                total += len(part)
        return total
    return 0


def _messages_tokens(messages: object) -> int:
    if not isinstance(messages, list):
        return 0
    chars = sum(_text_chars(m.get("content")) for m in messages if isinstance(m, Mapping))
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)


def estimate_prompt_tokens(endpoint: Endpoint, body: Mapping[str, object]) -> int:
    """The prompt's tokens, estimated (see the module doc)."""
    if endpoint == "chat":
        return _messages_tokens(body.get("messages"))
    if endpoint == "responses":
        given = body.get("input")
        items = _messages_tokens(given) if isinstance(given, list) else _prompt_tokens(given)
        return items + _prompt_tokens(body.get("instructions"))
    return _prompt_tokens(body.get("input" if endpoint == "embeddings" else "prompt"))


def _prompt_tokens(prompt: object) -> int:
    """A prompt's tokens: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(
            len(p) if isinstance(p, list) else math.ceil(_text_chars(p) / CHARS_PER_TOKEN)
            for p in prompt
        )
    return math.ceil(_text_chars(prompt) / CHARS_PER_TOKEN)
